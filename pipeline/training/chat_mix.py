"""A broad chat prompt mix for draft distillation: what users ask a chat model, written here.

The draft shipped first was distilled on instructions, maths, coding tasks and standard-library
completions (``prompt_sets.build_prompts``); on real chat prompts (MT-Bench-like first and second turns)
its acceptance falls. This mix covers the categories of the public chat benchmarks (MT-Bench's eight:
writing, roleplay, reasoning, maths, coding, extraction, STEM, humanities; Spec-Bench's summarization and
question answering) in proportions close to theirs, and about 40% of the conversations have a second
user turn that refers to the target's own first answer (the multi-turn shape of MT-Bench).

Everything is templated from the word lists of ``chat_mix_words`` and ``chat_mix_subjects`` (and, for
some coding and summarization prompts, the Python standard library's own functions and module
docstrings), so nothing evaluated can leak in; ``pipeline.training.contamination`` checks that at run
time anyway.

Held-out split: every list (templates, topics, personas, ...) is partitioned once, one item in five going
to ``heldout``; a ``heldout`` conversation is built from held-out items only where the list is long enough,
and never equals a ``train`` one, so the held-out alpha measures prompts whose templates and main topics
the draft has not been trained on.
"""

from __future__ import annotations

import ast
import functools
import random
from dataclasses import dataclass, field
from typing import Callable

from pipeline.training.chat_mix_subjects import (
    COMPANIES,
    COUNTRIES,
    EVENTS,
    EXTRACTION_ASKS,
    EXTRACTION_FOLLOWUPS,
    EXTRACTION_KINDS,
    GENERIC_FOLLOWUPS,
    HUMANITIES_FOLLOWUPS,
    HUMANITIES_SUBJECTS,
    HUMANITIES_TEMPLATES,
    INGREDIENTS,
    MONTHS,
    NEWS_SENTENCES,
    PRODUCTS,
    QA_FOLLOWUPS,
    QA_TEMPLATES,
    STEM_FOLLOWUPS,
    STEM_SUBJECTS,
    STEM_TEMPLATES,
    SUMMARY_ASKS,
    SUMMARY_FOLLOWUPS,
)
from pipeline.training.chat_mix_words import (
    AUDIENCES,
    CITIES,
    CODING_CONCEPTS,
    CODING_FOLLOWUPS,
    CODING_TASKS,
    CODING_TEMPLATES,
    DIRECTIONS,
    EMAIL_PEOPLE,
    EMAIL_REASONS,
    GENERAL_TOPICS,
    ITEMS,
    LANGS,
    MATH_FOLLOWUPS,
    NAMES,
    OBJECTS,
    PERSONAS,
    REASONING_FOLLOWUPS,
    ROLEPLAY_FOLLOWUPS,
    ROLEPLAY_TEMPLATES,
    SQL_ASKS,
    SQL_TABLES,
    TONES,
    WEEKDAYS,
    WRITING_FOLLOWUPS,
    WRITING_FORMS,
    WRITING_TEMPLATES,
)
from pipeline.training.prompt_sets import STDLIB, stdlib_functions

# MT-Bench: 8 categories x 10 questions, each with a second turn; Spec-Bench adds summarization and QA.
CATEGORY_WEIGHTS: dict[str, float] = {
    "writing": 0.12,
    "roleplay": 0.10,
    "reasoning": 0.10,
    "math": 0.12,
    "coding": 0.14,
    "extraction": 0.10,
    "stem": 0.10,
    "humanities": 0.08,
    "summarization": 0.08,
    "qa": 0.06,
}
MULTI_TURN = 0.4  # share of conversations with a second user turn
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Conversation:
    """One user conversation: ``turns`` are the user's messages (the assistant answers between them are
    the target's own samples, made when the teacher data is generated)."""

    category: str
    turns: tuple[str, ...]
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Pools:
    """The word lists of one split: item ``i`` of a list with at least 5 items is held out when ``i % 5 == 2``."""

    def __init__(self, split: str):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.split = split

    def part(self, items: list) -> list:
        if len(items) < 5:
            return items
        return [x for i, x in enumerate(items) if (i % 5 == 2) == (self.split == "heldout")]

    def pick(self, rng: random.Random, items: list):
        return rng.choice(self.part(items))

    def sample(self, rng: random.Random, items: list, k: int) -> list:
        part = self.part(items)
        return rng.sample(part, k) if len(part) >= k else rng.sample(items, k)


# --------------------------------------------------------------------------------------------------
# Generators: one per category, (rng, pools) -> (first turn, follow-up turn)
# --------------------------------------------------------------------------------------------------


def _fill(rng: random.Random, pools: Pools, template: str, **extra) -> str:
    """``template`` with every known placeholder filled from the split's lists."""
    t1, t2 = pools.sample(rng, GENERAL_TOPICS, 2)
    values = dict(
        topic=t1,
        topic2=t2,
        audience=pools.pick(rng, AUDIENCES),
        city=pools.pick(rng, CITIES),
        tone=pools.pick(rng, TONES),
        lang=pools.pick(rng, LANGS),
        **extra,
    )
    return template.format(**values)


def _writing(rng: random.Random, pools: Pools) -> tuple[str, str]:
    if rng.random() < 0.25:
        first = rng.choice(
            [
                "Write a professional email to {person} {reason}.",
                "Write a short, friendly message to {person} {reason}.",
                "Help me write an email to {person} {reason}. Keep it under 120 words.",
            ]
        ).format(person=pools.pick(rng, EMAIL_PEOPLE), reason=pools.pick(rng, EMAIL_REASONS))
    else:
        first = _fill(rng, pools, pools.pick(rng, WRITING_TEMPLATES), form=pools.pick(rng, WRITING_FORMS))
    return first, _fill(rng, pools, pools.pick(rng, WRITING_FOLLOWUPS))


def _roleplay(rng: random.Random, pools: Pools) -> tuple[str, str]:
    persona = _fill(rng, pools, pools.pick(rng, PERSONAS))
    return (
        _fill(rng, pools, pools.pick(rng, ROLEPLAY_TEMPLATES), persona=persona),
        _fill(rng, pools, pools.pick(rng, ROLEPLAY_FOLLOWUPS)),
    )


def _reasoning(rng: random.Random, pools: Pools) -> tuple[str, str]:
    names = pools.sample(rng, NAMES, 4)
    kind = rng.randrange(8)
    if kind == 0:
        a, b, c, d = names
        first = (
            f"{a} is taller than {b}. {c} is shorter than {b} but taller than {d}. Who is the tallest, and who is "
            "the shortest?"
        )
    elif kind == 1:
        day, n = rng.choice(WEEKDAYS), rng.randint(3, 40)
        first = f"If today is {day}, what day of the week will it be in {n} days? Explain how you got it."
    elif kind == 2:
        steps = [(rng.randint(1, 9), rng.choice(DIRECTIONS)) for _ in range(rng.randint(2, 4))]
        path = ", then ".join(f"{k} km {d}" for k, d in steps)
        first = (
            f"{names[0]} walks {path}. How far is {names[0]} from the starting point in a straight line, and in "
            "which direction?"
        )
    elif kind == 3:
        objs = pools.sample(rng, OBJECTS, 3)
        first = (
            f"There are three boxes in a row. The {objs[0]} is not in the first box. The {objs[1]} is to the right of "
            f"the {objs[0]}. The {objs[2]} is in the first box. Which object is in each box?"
        )
    elif kind == 4:
        start, step = rng.randint(1, 9), rng.randint(2, 5)
        seq = [start * step**i for i in range(5)] if rng.random() < 0.5 else [start + step * i * i for i in range(5)]
        first = f"What number comes next in the sequence {', '.join(map(str, seq))}? Explain the pattern."
    elif kind == 5:
        a, b, _, _ = names
        first = (
            f"All the musicians in {a}'s band can read music. {b} is in {a}'s band. Some people who read music also "
            f"play chess. Can we conclude that {b} plays chess? Why or why not?"
        )
    elif kind == 6:
        h, m = rng.randint(1, 12), rng.choice([0, 10, 15, 20, 30, 40, 45, 50])
        first = f"What is the angle between the hour hand and the minute hand of a clock at {h}:{m:02d}?"
    else:
        a, b, c, _ = names
        first = (
            f"{a}, {b} and {c} each have a different pet: a cat, a dog and a parrot. {a} is allergic to fur. "
            f"{b} does not own the dog. Who owns which pet?"
        )
    return first, pools.pick(rng, REASONING_FOLLOWUPS)


def _math(rng: random.Random, pools: Pools) -> tuple[str, str]:
    a, b, c = rng.randint(2, 90), rng.randint(2, 40), rng.randint(2, 15)
    n1, n2 = pools.sample(rng, NAMES, 2)
    item = pools.pick(rng, ITEMS)
    forms = [
        (
            f"{n1} buys {a} {item} at ${c} each and sells them all for ${a * c + b * c}. What is the profit as a "
            "percentage of the cost?"
        ),
        (
            f"{n1} had some {item}. After giving {b} to {n2} and buying {c} more, {n1} has {a}. How many did {n1} "
            "start with?"
        ),
        f"Solve the system of equations: x + y = {a + b}, x - y = {a - b}.",
        f"Solve for x: {c}x - {b} = {c * a - b}. Show each step.",
        f"A rectangle has a perimeter of {2 * (a + b)} cm and one side of {a} cm. What is its area?",
        f"What is {a}% of {b * 50}? And what percentage of {b * 50} is {a * b // 2}?",
        (
            f"A car uses {c} litres of fuel per 100 km. How much fuel does it need for {a * 10} km, and what does it "
            f"cost at ${b / 20:.2f} per litre?"
        ),
        (
            "Find the mean and the median of these numbers: "
            f"{', '.join(str(rng.randint(1, 99)) for _ in range(rng.randint(5, 9)))}."
        ),
        f"Two dice are rolled. What is the probability that the sum is at least {rng.randint(5, 11)}?",
        f"Simplify the fraction {a * c}/{b * c} and write it as a decimal.",
        f"A recipe for {c} people needs {b * 10} g of flour. How much flour is needed for {a} people?",
        f"What is the sum of all integers from 1 to {a * 10}?",
        f"Compute the derivative of f(x) = {c}x^3 - {b}x^2 + {a}x and find f'(1).",
        (
            f"A savings account pays {c}% interest per year, compounded yearly. How much will ${a * 100} be worth "
            f"after {rng.randint(2, 6)} years?"
        ),
        f"{n1} can paint a fence in {b} hours and {n2} can paint it in {b + c} hours. How long do they take together?",
        f"A triangle has sides {3 * c}, {4 * c} and {5 * c}. Is it a right triangle? What is its area?",
    ]
    return pools.pick(rng, forms), pools.pick(rng, MATH_FOLLOWUPS)


def _coding(rng: random.Random, pools: Pools) -> tuple[str, str]:
    kind = rng.random()
    if kind < 0.6:
        first = _fill(
            rng,
            pools,
            pools.pick(rng, CODING_TEMPLATES),
            task=pools.pick(rng, CODING_TASKS),
            concept=pools.pick(rng, CODING_CONCEPTS),
        )
    elif kind < 0.75:
        table, cols = pools.pick(rng, SQL_TABLES)
        ask = pools.pick(rng, SQL_ASKS).format(num=cols[3] if table != "orders" else "amount", cat=cols[2])
        first = f"I have a table {table}({', '.join(cols)}). Write an SQL query that returns {ask}."
    else:  # a real standard-library function to explain, review or complete
        module, name, header, source = pools.pick(rng, list(stdlib_functions()))
        first = pools.pick(
            rng,
            [
                f"What does this function do?\n```python\n{source[:900]}\n```",
                f"Can you suggest improvements to this code?\n\n{source[:900]}",
                f"Complete this Python function:\n```python\n{header}\n```",
                f"Write the body of `{name}` from the `{module}` module:\n\n{header}",
                f"Add comments to this code and explain any tricky parts:\n```python\n{source[:900]}\n```",
            ],
        )
    return first, _fill(rng, pools, pools.pick(rng, CODING_FOLLOWUPS))


def _document(rng: random.Random, pools: Pools, kind: str) -> str:
    """A short synthetic document of ``kind`` with names, dates, amounts and places to extract."""
    n = pools.sample(rng, NAMES, 3)
    comp = pools.pick(rng, COMPANIES)
    month, day = rng.choice(MONTHS), rng.randint(1, 28)
    city = pools.pick(rng, CITIES)
    money = lambda: f"${rng.randint(5, 900)}.{rng.randint(0, 99):02d}"  # noqa: E731
    if kind == "receipt":
        lines = [f"{comp} - {city}", f"Date: {month} {day}"]
        lines += [f"{pools.pick(rng, PRODUCTS)} x{rng.randint(1, 4)}  {money()}" for _ in range(rng.randint(2, 5))]
        lines += [f"Cashier: {n[0]}", f"Total paid by card: {money()}"]
        return "\n".join(lines)
    if kind == "meeting notes":
        return (
            f"Meeting notes, {month} {day}. Present: {n[0]}, {n[1]}, {n[2]}.\n- {n[0]} will send the budget "
            f"({money()}) to {comp} by Friday.\n- {n[1]} reported that the {city} office opens on {rng.choice(MONTHS)} "
            f"{rng.randint(1, 28)}.\n- {n[2]} to book a venue for the workshop; max {rng.randint(20, 120)} people.\n"
            f"- Next meeting: {rng.choice(WEEKDAYS)} at {rng.randint(9, 16)}:00."
        )
    if kind == "job posting":
        return (
            f"{comp} is hiring a "
            f"{rng.choice(['data analyst', 'junior developer', 'office manager', 'nurse', 'sales lead'])} in {city}. "
            f"Salary: {rng.randint(30, 90)},000 per year. Start date: {month} {day}. Apply by sending your CV to "
            f"{n[0].lower()}@{comp.split()[0].lower()}.example. Requirements: {rng.randint(1, 6)} years of experience "
            "and fluent English."
        )
    if kind == "event announcement":
        return (
            f"Join us for the {city} {pools.pick(rng, GENERAL_TOPICS)} festival on {month} {day}! Doors open at "
            f"{rng.randint(9, 19)}:00. Tickets cost {money()} ({money()} for students). Speakers include {n[0]} and "
            f"{n[1]}. Sponsored by {comp}."
        )
    if kind == "product reviews":
        out = []
        for i in range(rng.randint(2, 4)):
            mood = rng.choice(
                [
                    "Absolutely love it",
                    "Broke after a week",
                    "Does the job, nothing special",
                    "Too expensive for what it is",
                    "Best purchase this year",
                    "Arrived late but works fine",
                ]
            )
            out.append(f"Review {i + 1} ({rng.choice(n)}): {pools.pick(rng, PRODUCTS)} - {mood}.")
        return "\n".join(out)
    if kind == "travel itinerary":
        c2 = pools.pick(rng, CITIES)
        return (
            f"Passenger: {n[0]}. Flight from {city} to {c2} on {month} {day}, departing "
            f"{rng.randint(6, 22)}:{rng.choice(['05', '20', '45'])}. Hotel: {comp} Inn, {rng.randint(2, 7)} nights, "
            f"{money()} per night. Return flight on {rng.choice(MONTHS)} {rng.randint(1, 28)}."
        )
    if kind == "customer emails":
        return (
            f"From: {n[0]}\nHi, I ordered {pools.pick(rng, PRODUCTS)} on {month} {day} (order "
            f"#{rng.randint(10000, 99999)}) and paid {money()}, but it has not arrived in {city} yet.\n\nFrom: "
            f"{n[1]}\nHello {comp}, I would like to return {pools.pick(rng, PRODUCTS)}; it is the wrong size."
        )
    return (
        f"Lab report by {n[0]} and {n[1]}, {month} {day}. Sample A weighed {rng.randint(10, 99)}.{rng.randint(0, 9)} "
        f"g; sample B {rng.randint(10, 99)}.{rng.randint(0, 9)} g. Heated to {rng.randint(40, 300)} degrees C for "
        f"{rng.randint(5, 60)} minutes. Equipment supplied by {comp}."
    )


def _extraction(rng: random.Random, pools: Pools) -> tuple[str, str]:
    doc = _document(rng, pools, pools.pick(rng, EXTRACTION_KINDS))
    ask = pools.pick(rng, EXTRACTION_ASKS)
    first = f"{ask}\n\n{doc}" if rng.random() < 0.5 else f"Here is a text:\n{doc}\n\n{ask}"
    return first, pools.pick(rng, EXTRACTION_FOLLOWUPS)


def _stem(rng: random.Random, pools: Pools) -> tuple[str, str]:
    s1, s2 = pools.sample(rng, STEM_SUBJECTS, 2)
    return (
        _fill(rng, pools, pools.pick(rng, STEM_TEMPLATES), subject=s1, subject2=s2),
        pools.pick(rng, STEM_FOLLOWUPS),
    )


def _humanities(rng: random.Random, pools: Pools) -> tuple[str, str]:
    s1, s2 = pools.sample(rng, HUMANITIES_SUBJECTS, 2)
    return (
        _fill(rng, pools, pools.pick(rng, HUMANITIES_TEMPLATES), subject=s1, subject2=s2),
        pools.pick(rng, HUMANITIES_FOLLOWUPS),
    )


@functools.cache
def stdlib_module_docs(min_chars: int = 500, max_chars: int = 1500) -> tuple[str, ...]:
    """Module docstrings of the standard library (prose written by people, to summarize), trimmed at a paragraph."""
    out = []
    for path in sorted(STDLIB.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if not doc or len(doc) < min_chars:
            continue
        text = doc[:max_chars]
        cut = text.rfind("\n\n")
        out.append(text[:cut] if len(doc) > max_chars and cut > min_chars // 2 else text)
    return tuple(out)


def _summarization(rng: random.Random, pools: Pools) -> tuple[str, str]:
    if rng.random() < 0.3 and stdlib_module_docs():
        text = pools.pick(rng, list(stdlib_module_docs()))
    else:
        n1, n2 = pools.sample(rng, NAMES, 2)
        sentences = rng.sample(NEWS_SENTENCES, rng.randint(5, 9))
        text = " ".join(
            s.format(
                city=pools.pick(rng, CITIES),
                weekday=rng.choice(WEEKDAYS),
                topic=pools.pick(rng, GENERAL_TOPICS),
                money=f"${rng.randint(2, 90)} million",
                n=rng.randint(2, 24),
                name=n1,
                name2=n2,
                month=rng.choice(MONTHS),
                pct=rng.randint(35, 85),
                company=pools.pick(rng, COMPANIES),
            )
            for s in sentences
        )
    ask = pools.pick(rng, SUMMARY_ASKS)
    return ask.format(text=text, audience=pools.pick(rng, AUDIENCES)), pools.pick(rng, SUMMARY_FOLLOWUPS)


def _qa(rng: random.Random, pools: Pools) -> tuple[str, str]:
    ing = pools.sample(rng, INGREDIENTS, 3)
    first = _fill(
        rng,
        pools,
        pools.pick(rng, QA_TEMPLATES),
        country=pools.pick(rng, COUNTRIES),
        ing1=ing[0],
        ing2=ing[1],
        ing3=ing[2],
        event=pools.pick(rng, EVENTS),
    )
    return first, pools.pick(rng, QA_FOLLOWUPS)


GENERATORS: dict[str, Callable[[random.Random, Pools], tuple[str, str]]] = {
    "writing": _writing,
    "roleplay": _roleplay,
    "reasoning": _reasoning,
    "math": _math,
    "coding": _coding,
    "extraction": _extraction,
    "stem": _stem,
    "humanities": _humanities,
    "summarization": _summarization,
    "qa": _qa,
}
assert set(GENERATORS) == set(CATEGORY_WEIGHTS)


def _conversations(n: int, seed: int, split: str, multi_turn: float) -> list[Conversation]:
    rng = random.Random(f"chat-mix/{split}/{seed}")
    pools = Pools(split)
    cats, weights = list(CATEGORY_WEIGHTS), list(CATEGORY_WEIGHTS.values())
    out = []
    for _ in range(n):
        cat = rng.choices(cats, weights)[0]
        first, follow = GENERATORS[cat](rng, pools)
        if rng.random() < 0.15:
            follow = rng.choice(GENERIC_FOLLOWUPS)
        turns = (first, follow) if rng.random() < multi_turn else (first,)
        out.append(Conversation(cat, turns))
    return out


def chat_conversations(n: int, seed: int, split: str = "train", multi_turn: float = MULTI_TURN) -> list[Conversation]:
    """``n`` conversations of the mix, deterministic in ``seed`` and ``split`` (a prefix of a longer run is
    the shorter run). Held-out ones are drawn from the held-out items of every list; a caller that needs
    them strictly disjoint from a training set drops the few whose first turn a training one repeats
    (``teacher_data.chat_heldout_conversations``)."""
    return _conversations(n, seed, split, multi_turn)
