"""Teacher data for draft distillation: offline prompts, the target's own sampled answers, top-k log-probs.

Everything here is built on this machine from the project's own templates and the Python standard
library's source, so no evaluation prompt (HumanEval, MT-Bench, Spider, Spec-Bench, CNN/DM) can leak
into training. Two kinds of records are produced, both in the chat format of the target:

- ``gen``: an instruction prompt and the target's *sampled* answer (on-policy: the contexts a draft
  meets when it drafts for this target), with the teacher's top-k log-probabilities at every answer
  position, recorded while sampling (no second pass);
- ``tf``: a standard-library function shown as an assistant answer and scored by one teacher-forced
  target pass (cheaper per token than sampling: one parallel forward instead of one step per token).

Shards are written as they are produced (``.cache/distill/<name>/shard-XXXX.pt``) so that a run can be
stopped at any time and training can use what exists.

The heads (Medusa, EAGLE) learn from a second offline corpus, the *feature corpus* (``feature_data``):
standard-library source shown as chat answers and the target's own sampled answers to the prompts of
``FEATURE_TOPICS`` / ``FEATURE_CODE_TASKS``, with the frozen target's last hidden states over it. Its
prompts and its sampler (transformers' ``generate`` under the global seed) stay as they were when the
shipped heads were trained, so that a run with the same seed rebuilds the same data.
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from pipeline.decoding.warping import warp
from pipeline.prompts import chat_ids

STDLIB = Path(sysconfig.get_paths()["stdlib"])  # the running interpreter's standard library (training text)

# --------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "machine learning", "climate change",
    "the human immune system", "blockchain", "the water cycle", "volcanoes", "the stock market",
    "quantum computing", "the Roman Empire", "renewable energy", "vaccines", "the internet",
    "electric cars", "coral reefs", "inflation", "the Renaissance", "DNA", "earthquakes",
    "social media", "meditation", "the solar system", "artificial intelligence", "democracy",
    "the printing press", "antibiotics", "plate tectonics", "jazz music", "the Great Wall of China",
    "recycling", "sleep", "coffee", "honeybees", "the moon landing", "cryptography", "gravity",
    "supply and demand", "the Olympic Games", "rainforests", "nuclear energy", "the Silk Road",
    "public speaking", "time management", "healthy eating", "remote work", "urban gardening",
    "the theory of evolution", "ocean currents", "3D printing", "the Industrial Revolution",
    "volunteering", "learning a new language", "budgeting", "marathon training", "video games",
    "smartphones", "ancient Egypt", "the periodic table", "tea", "chess", "photography",
    "bread baking", "dinosaurs", "hurricanes", "the Amazon river", "cloud computing", "robots",
    "mindfulness", "minimalism", "space exploration", "the history of mathematics", "penguins",
    "wind turbines", "online privacy", "self-driving cars", "pollination", "the human brain",
    "composting", "classical music", "the Cold War", "microplastics", "open source software",
]
AUDIENCES = ["a 10-year-old", "a high school student", "a busy professional", "a beginner", "an expert",
             "my grandmother", "a new employee", "a university student"]
THINGS = ["a small bakery", "a mobile app", "a local library", "a bicycle shop", "a yoga studio",
          "a science fair project", "a birthday party", "a team offsite", "a podcast", "a charity run",
          "a community garden", "an online course", "a board game night", "a hiking trip", "a book club"]
PEOPLE = ["my manager", "a customer", "a landlord", "a professor", "a colleague", "a friend",
          "a neighbour", "the city council", "a job recruiter", "my team"]
REASONS = ["asking for a deadline extension", "thanking them for their help", "declining an invitation",
           "requesting a meeting", "reporting a problem", "apologizing for a delay", "asking for a reference",
           "proposing a new idea", "following up on an interview", "announcing a schedule change"]

INSTRUCTION_TEMPLATES = [
    "Explain {topic} to {audience}.",
    "What are the main advantages and disadvantages of {topic}?",
    "Give me five interesting facts about {topic}.",
    "Write a short poem about {topic}.",
    "Write a short story that involves {topic}.",
    "Summarize the history of {topic} in a few paragraphs.",
    "What are common misconceptions about {topic}?",
    "Write a blog post introduction about {topic}.",
    "How would you teach {topic} to {audience}?",
    "Compare {topic} and {topic2}. What do they have in common?",
    "Write a persuasive paragraph arguing that everyone should learn about {topic}.",
    "List three questions a student might ask about {topic}, and answer them.",
    "Describe {topic} in exactly three sentences.",
    "What is the future of {topic}?",
    "Create a quiz with four multiple-choice questions about {topic}.",
    "Write a professional email to {person} {reason}.",
    "Write a friendly message to {person} {reason}.",
    "Give me a step-by-step plan for organizing {thing}.",
    "Suggest a catchy name and a slogan for {thing}.",
    "Write a product description for {thing}.",
    "What are some tips for running {thing} successfully?",
    "Draft a short speech for the opening of {thing}.",
    "Rewrite the following sentence to sound more formal: 'hey, can u send me the stuff about {topic} asap?'",
    "Translate this idea into simple words: {topic} is a complex subject with many facets.",
    "Write a dialogue between two friends discussing {topic}.",
    "Pretend you are a tour guide and describe {topic}.",
    "What ethical questions does {topic} raise?",
    "Write a haiku about {topic}.",
    "Give a one-paragraph definition of {topic}.",
    "Role-play as a teacher introducing {topic} to {audience}.",
]

NAMES = ["Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jon"]
ITEMS = ["apples", "books", "pencils", "tickets", "marbles", "cookies", "stamps", "coins", "shirts", "plants"]

CODING_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "finds the largest element of a list",
    "checks whether a string is a palindrome", "flattens a nested list", "computes the greatest common divisor",
    "converts Celsius to Fahrenheit", "sorts a list of dictionaries by a key", "counts word frequencies in a text",
    "finds the second largest number in a list", "transposes a matrix", "checks whether two strings are anagrams",
    "returns the sum of the digits of an integer", "implements binary search", "implements bubble sort",
    "implements quicksort", "implements merge sort", "reads a CSV file and returns the rows as dictionaries",
    "validates an email address with a regular expression", "computes the average of a list of numbers",
    "finds all pairs in a list that sum to a target", "rotates a list by k positions",
    "returns the longest common prefix of a list of strings", "converts a Roman numeral to an integer",
    "converts an integer to binary without using bin()", "checks whether parentheses are balanced",
    "computes the median of a list", "finds the most common element in a list", "capitalizes every word",
    "computes the power set of a list", "generates all permutations of a string", "chunks a list into pieces of size n",
    "computes running totals of a list", "returns the indices of the minimum values", "counts the lines in a file",
    "parses a date string and returns the weekday", "implements a stack class", "implements a queue with two stacks",
    "implements a simple LRU cache", "computes the dot product of two vectors", "multiplies two matrices",
    "checks whether a year is a leap year", "computes the Levenshtein distance between two strings",
    "finds the missing number in a list from 1 to n", "returns the prime factors of a number",
    "converts a string to snake_case", "converts snake_case to camelCase", "computes compound interest",
    "returns the n largest elements of a list", "groups a list of words by their first letter",
    "checks whether a list is sorted", "computes the area of a circle", "finds the intersection of two lists",
    "computes the Collatz sequence of a number", "returns the words of a sentence longer than k characters",
    "counts the number of islands in a grid", "evaluates a postfix expression", "implements a linked list",
    "finds the longest increasing subsequence", "computes Pascal's triangle", "encrypts text with a Caesar cipher",
    "returns the unique characters of a string", "zips two lists into a dictionary", "computes the mode of a list",
    "checks whether a number is a perfect square", "sums the even numbers in a list", "finds the shortest word",
]
LANGS = ["Python", "Python", "Python", "Python", "JavaScript", "SQL", "C", "Java", "Bash", "Rust"]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}. Include a docstring and an example.",
    "How do I write a function in {lang} that {task}?",
    "Write a {lang} program that {task}, and explain how it works.",
    "Write a Python function that {task}. Add type hints.",
    "Write a Python function that {task}, then write two unit tests for it.",
    "Explain the time complexity of a function that {task}.",
    "Write a Python function that {task}. Return only the code.",
]


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    n1, n2 = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    forms = [
        f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} gives away {c}. How many {item} does {n1} have now?",
        f"A shop sells {item} for ${c} each. {n1} buys {a} of them and pays with ${a * c + b}. How much change does {n1} get?",
        f"If {a} workers can build a wall in {b} days, how long would {a + c} workers take? Explain your reasoning.",
        f"Solve for x: {a}x + {b} = {a * c + b}.",
        f"What is {a} multiplied by {b}, plus {c}? Show your work.",
        f"A train travels at {a} km/h for {c} hours and then at {b} km/h for {c} more hours. What distance does it cover?",
        f"{n1} reads {c} pages a day. How many days does {n1} need to finish a book of {a * c + b} pages?",
        f"What is the probability of rolling a sum of {rng.randint(2, 12)} with two fair dice?",
        f"Find the area and the perimeter of a rectangle that is {a} cm long and {b} cm wide.",
        f"Is {a * b + c} a prime number? Explain.",
    ]
    return rng.choice(forms)


@functools.cache  # parsing the standard library takes seconds; the result depends only on max_chars
def _stdlib_functions(max_chars: int = 1800) -> tuple[tuple[str, str, str, str], ...]:
    """(module, function name, header-with-docstring, full source) of documented stdlib functions."""
    root = STDLIB
    out = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo"} for part in path.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        module = path.stem if path.parent == root else f"{path.parent.name}.{path.stem}"
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or node.end_lineno is None:
                continue
            source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if len(source) > max_chars or len(node.body) < 2:
                continue
            body0 = node.body[1]
            header = "\n".join(lines[node.lineno - 1 : body0.lineno - 1])
            out.append((module, node.name, header, source))
    return tuple(out)


def build_prompts(n: int, seed: int) -> list[str]:
    """``n`` user prompts for sampled answers: instructions, maths, coding tasks, stdlib completions."""
    rng = random.Random(seed)
    funcs = _stdlib_functions()
    prompts = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.40:
            t1, t2 = rng.sample(TOPICS, 2)
            prompts.append(rng.choice(INSTRUCTION_TEMPLATES).format(
                topic=t1, topic2=t2, audience=rng.choice(AUDIENCES), thing=rng.choice(THINGS),
                person=rng.choice(PEOPLE), reason=rng.choice(REASONS)))
        elif kind < 0.50:
            prompts.append(_math_prompt(rng))
        elif kind < 0.72:
            prompts.append(rng.choice(CODE_TEMPLATES).format(lang=rng.choice(LANGS), task=rng.choice(CODING_TASKS)))
        elif kind < 0.92:
            module, name, header, _ = rng.choice(funcs)
            style = rng.randrange(3)
            if style == 0:
                prompts.append(f"Complete the following Python function:\n```python\n{header}\n```")
            elif style == 1:
                prompts.append(f"Write the body of this function from the `{module}` module:\n\n{header}")
            else:
                prompts.append(f"{header}\n")
        else:
            module, name, _, source = rng.choice(funcs)
            prompts.append(rng.choice([
                "Explain what this Python code does:\n```python\n{src}\n```",
                "Find possible bugs or improvements in this code:\n{src}",
                "Add comments to this function:\n```python\n{src}\n```",
            ]).format(src=source[:900]))
    return prompts


# --------------------------------------------------------------------------------------------------
# Teacher passes
# --------------------------------------------------------------------------------------------------


@dataclass
class Record:
    """One training sequence: ``ids`` (prompt + answer), answer start, teacher top-k at answer positions.

    ``topk_ids[j]`` / ``topk_logp[j]`` describe the teacher's next-token distribution at position
    ``start - 1 + j`` (predicting ``ids[start + j]``).
    """

    ids: torch.Tensor  # int32 [L]
    start: int
    topk_ids: torch.Tensor  # int32 [L - start, K]
    topk_logp: torch.Tensor  # float16 [L - start, K]
    kind: str


def padding_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its EOS."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(prompt_ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of prompts (so that every row's next token is at the end): ids and attention mask."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def _warped_sample(logits: torch.Tensor, top_k: int, top_p: float, gen: torch.Generator) -> torch.Tensor:
    probs = warp(logits, 1.0, top_k, top_p)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def sample_answers(
    target, prompt_ids: list[list[int]], *, max_new_tokens: int, top_k_store: int, sample_top_k: int,
    sample_top_p: float, eos_id: int, pad_id: int, gen: torch.Generator,
) -> list[Record]:
    """Sample one answer per prompt in one left-padded batch; record the teacher's top-k at each step.

    Finished rows are dropped from the batch (and the KV cache) so no step is spent on them.
    """
    b = len(prompt_ids)
    ids, mask = left_pad(prompt_ids, pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    logits = target(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits[:, -1]
    alive = torch.arange(b)
    next_pos = pos[:, -1] + 1
    answers: list[list[int]] = [[] for _ in range(b)]
    tk_ids: list[list[torch.Tensor]] = [[] for _ in range(b)]
    tk_lp: list[list[torch.Tensor]] = [[] for _ in range(b)]
    for step in range(max_new_tokens):
        logp = logits.float().log_softmax(-1)
        vals, idx = logp.topk(top_k_store, dim=-1)
        tok = _warped_sample(logits, sample_top_k, sample_top_p, gen)
        keep = []
        for r, row in enumerate(alive.tolist()):
            answers[row].append(int(tok[r]))
            tk_ids[row].append(idx[r].to(torch.int32))
            tk_lp[row].append(vals[r].to(torch.float16))
            if int(tok[r]) != eos_id:
                keep.append(r)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(alive):
            sel = torch.tensor(keep)
            cache.batch_select_indices(sel)
            alive, mask, next_pos, tok = alive[sel], mask[sel], next_pos[sel], tok[sel]
        mask = torch.cat([mask, torch.ones((len(alive), 1), dtype=torch.long)], dim=1)
        logits = target(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                        past_key_values=cache, use_cache=True).logits[:, -1]
        next_pos = next_pos + 1
    out = []
    for i, p in enumerate(prompt_ids):
        full = torch.tensor(p + answers[i], dtype=torch.int32)
        out.append(Record(full, len(p), torch.stack(tk_ids[i]), torch.stack(tk_lp[i]), "gen"))
    return out


@torch.no_grad()
def teacher_force(target, seqs: list[tuple[list[int], int]], *, top_k_store: int, pad_id: int) -> list[Record]:
    """Teacher top-k at the answer positions of complete sequences (right-padded batch, one pass)."""
    b = len(seqs)
    width = max(len(s) for s, _ in seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, (s, _) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
    out = []
    for i, (s, start) in enumerate(seqs):
        h = hidden[i, start - 1 : len(s) - 1]
        logp = target.lm_head(h).float().log_softmax(-1)
        vals, idx = logp.topk(top_k_store, dim=-1)
        out.append(Record(torch.tensor(s, dtype=torch.int32), start, idx.to(torch.int32), vals.to(torch.float16), "tf"))
    return out


def build_tf_sequences(tokenizer, n: int, seed: int, max_len: int) -> list[tuple[list[int], int]]:
    """Chat-formatted stdlib functions: the user asks for a function, the answer is its real source."""
    rng = random.Random(seed + 1)
    funcs = list(_stdlib_functions())  # a copy: the parsed functions are cached
    rng.shuffle(funcs)
    seqs = []
    for module, name, header, source in funcs[:n]:
        first = header.strip().splitlines()[0]
        user = rng.choice([
            f"Write a Python function `{name}` like the one in the `{module}` module.",
            f"Implement this function:\n{first}",
            f"Show me how `{module}.{name}` could be implemented in Python.",
        ])
        answer = rng.choice(["", "Here is an implementation:\n\n", "Sure! "]) + f"```python\n{source}\n```"
        start = len(chat_ids(tokenizer, user))
        ids = chat_ids(tokenizer, user, answer)[:max_len]
        if len(ids) - start >= 16:
            seqs.append((ids, start))
    return seqs


def generate_teacher_data(
    target, tokenizer, out_dir: Path, *, n_prompts: int, tf_fraction: float, batch_size: int,
    max_new_tokens: int, top_k_store: int, sample_top_k: int, sample_top_p: float, seed: int,
    time_budget_s: float, max_shards: int | None = None, max_tf_len: int = 320, log=print,
) -> None:
    """Write teacher shards to ``out_dir`` until ``n_prompts`` are done or the time budget is spent.

    ``max_shards`` stops after that many shards (a run cut by the time budget is reproduced exactly
    by setting it to the number of shards the run wrote). Shards alternate between sampled answers (``gen``) and teacher-forced stdlib sources (``tf``) so
    that any prefix of the run holds both, in the proportion ``tf_fraction`` of shards.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts = build_prompts(n_prompts, seed)
    # Left padding wastes prefill work on short prompts: sort by length inside blocks of 8 batches
    # (blocks keep every kind of prompt spread over the whole run).
    block = 8 * batch_size
    lengths = [len(chat_ids(tokenizer, p)) for p in prompts]
    order = [i for b in range(0, len(prompts), block) for i in sorted(range(b, min(b + block, len(prompts))), key=lengths.__getitem__)]
    prompts = [prompts[i] for i in order]
    n_tf = int(round(n_prompts * tf_fraction))
    tf_seqs = build_tf_sequences(tokenizer, n_tf, seed, max_tf_len)
    pad = padding_id(tokenizer)
    t0 = time.time()
    shard, pi, ti, total = 0, 0, 0, 0
    done = {p.name for p in out_dir.glob("shard-*.pt")}
    every_tf = max(1, round(1 / tf_fraction) - 1) if tf_fraction > 0 else 0
    while (pi < len(prompts) or ti < len(tf_seqs)) and (max_shards is None or shard < max_shards):
        use_tf = tf_fraction > 0 and ti < len(tf_seqs) and (pi >= len(prompts) or (shard % (every_tf + 1) == every_tf))
        name = f"shard-{shard:04d}.pt"
        if use_tf:
            batch = tf_seqs[ti : ti + max(1, batch_size // 2)]
            ti += len(batch)
        else:
            batch = prompts[pi : pi + batch_size]
            pi += len(batch)
        if name in done:  # resume: the generator state is re-derived from the shard's index
            shard += 1
            continue
        g = torch.Generator().manual_seed(seed * 100003 + shard)
        if use_tf:
            recs = teacher_force(target, batch, top_k_store=top_k_store, pad_id=pad)
        else:
            recs = sample_answers(
                target, [chat_ids(tokenizer, p) for p in batch], max_new_tokens=max_new_tokens,
                top_k_store=top_k_store, sample_top_k=sample_top_k, sample_top_p=sample_top_p,
                eos_id=tokenizer.eos_token_id, pad_id=pad, gen=g)
        torch.save([r.__dict__ for r in recs], out_dir / name)
        ntok = sum(len(r.topk_ids) for r in recs)
        total += ntok
        el = time.time() - t0
        log(f"shard {shard} {'tf ' if use_tf else 'gen'} records {len(recs)} tokens {ntok} total {total} "
            f"elapsed {el:.0f}s rate {total / max(el, 1e-9):.1f} tok/s")
        shard += 1
        if el > time_budget_s:
            log(f"time budget reached after {el:.0f}s")
            break


def load_records(data_dir: Path) -> list[dict]:
    recs = []
    for p in sorted(Path(data_dir).glob("shard-*.pt")):
        recs.extend(torch.load(p))
    return recs


# --------------------------------------------------------------------------------------------------
# Feature corpus (Medusa and EAGLE heads): stdlib source as chat answers, the target's sampled answers
# --------------------------------------------------------------------------------------------------

FEATURE_TOPICS = [
    "tides", "glaciers", "the printing of books", "solar panels", "bicycles", "typography", "origami",
    "the immune response", "beekeeping", "lighthouses", "sourdough", "submarines", "compilers",
    "hash tables", "version control", "unit testing", "regular expressions", "spreadsheets",
    "bird migration", "rainbows", "thunderstorms", "fermentation", "caves", "deserts", "satellites",
    "libraries", "maps", "clocks", "trains", "bridges", "recycling paper", "word processors",
]
FEATURE_INSTRUCTIONS = [
    "Explain {t} to a curious teenager.",
    "Give three interesting facts about {t}.",
    "Write a short paragraph about the history of {t}.",
    "What are the pros and cons of {t}?",
    "Write a haiku and then a short explanation about {t}.",
    "Summarize how {t} works in a few sentences.",
]
FEATURE_CODE_TASKS = [
    "counts the vowels in a string", "merges two sorted lists", "computes a moving average",
    "parses a date in YYYY-MM-DD format", "flattens a nested list", "checks whether a year is a leap year",
    "converts Celsius to Fahrenheit for a list of values", "removes duplicate lines from a text file",
    "finds the most common word in a paragraph", "validates a simple email address",
    "computes the greatest common divisor of two numbers", "transposes a matrix given as a list of lists",
]
FEATURE_CODE_TEMPLATES = [
    "Write a Python function that {t}. Add a docstring.",
    "Show a small Python program that {t}, with comments.",
]


def feature_prompts(seed: int) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): disjoint topics/tasks, written here."""
    rng = random.Random(seed)
    prose = [i.format(t=t) for t in FEATURE_TOPICS for i in FEATURE_INSTRUCTIONS]
    code = [c.format(t=t) for t in FEATURE_CODE_TASKS for c in FEATURE_CODE_TEMPLATES]
    rng.shuffle(prose)
    rng.shuffle(code)
    held = prose[:12] + code[:4]
    train = prose[12:] + code[4:]
    held_topics = {p for p in held}
    return [p for p in train if p not in held_topics], held


def stdlib_chunks(n_files_train: int, n_files_heldout: int, max_chars: int, seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) lists of (relative path, source chunk) from different stdlib files."""
    root = STDLIB
    files = sorted(
        p for p in root.rglob("*.py")
        if "test" not in p.parts and "tests" not in p.parts and "site-packages" not in p.parts
        and "idlelib" not in p.parts and p.stat().st_size > 2000
    )
    rng = random.Random(seed)
    rng.shuffle(files)

    def take(sel):
        out = []
        for p in sel:
            text = p.read_text(errors="ignore")
            start = rng.randrange(0, max(1, len(text) - max_chars))
            out.append((str(p.relative_to(root)), text[start : start + max_chars]))
        return out

    return take(files[:n_files_train]), take(files[n_files_train : n_files_train + n_files_heldout])


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int, seed: int, log) -> list[list[int]]:
    """The target's sampled answers (prompt + answer ids), T=1 top-k 10 top-p 0.9, batched with left padding."""
    torch.manual_seed(seed)
    pad = padding_id(tokenizer)
    out = []
    for b in range(0, len(prompts), batch_size):
        batch = [chat_ids(tokenizer, p) for p in prompts[b : b + batch_size]]
        ids, mask = left_pad(batch, pad)
        width = ids.shape[1]
        gen = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=10, top_p=0.9,
            max_new_tokens=max_new_tokens, pad_token_id=pad,
        )
        for x, row in zip(batch, gen[:, width:].tolist()):
            eos = tokenizer.eos_token_id
            answer = row[: row.index(eos) + 1] if eos in row else row
            out.append(x + [t for t in answer if t != pad or t == eos])
        log(f"sampled answers {min(b + batch_size, len(prompts))}/{len(prompts)}")
    return out


@torch.no_grad()
def hidden_states(model, sequences: list[list[int]], log, tag: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenated last hidden states ``[N, H]`` (fp32), token ids ``[N]`` and sequence ids ``[N]``."""
    hs, ids, seq = [], [], []
    backbone = model.get_decoder()
    for i, s in enumerate(sequences):
        x = torch.tensor([s])
        hs.append(backbone(input_ids=x).last_hidden_state[0].float())
        ids.append(x[0])
        seq.append(torch.full((len(s),), i))
        if (i + 1) % 20 == 0:
            log(f"hidden states [{tag}] {i + 1}/{len(sequences)}")
    return torch.cat(hs), torch.cat(ids), torch.cat(seq)


def feature_data(model, tokenizer, data_cfg: dict[str, Any], seed: int, cache: Path, log) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The offline training/held-out text and the frozen target's last hidden states over it (cached in ``cache``).

    Tags ``train`` (stdlib source + the target's sampled answers), ``heldout_stdlib``, ``heldout_answers``;
    each ``(hidden [N, H], token ids [N], sequence ids [N])`` (``hidden_states``). Used by Medusa and EAGLE training.
    """
    if cache.exists():
        log(f"loaded cached data {cache}")
        return torch.load(cache)
    train_prompts, held_prompts = feature_prompts(seed)
    train_prompts = train_prompts[: data_cfg["n_prompts"]]
    held_prompts = held_prompts[: data_cfg["n_heldout_prompts"]]
    src_train, src_held = stdlib_chunks(data_cfg["n_stdlib_files"], data_cfg["n_heldout_stdlib_files"], data_cfg["stdlib_chars"], seed)
    limit = data_cfg["max_len"]
    seqs_train = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_train]
    seqs_held = [chat_ids(tokenizer, f"Show me the code of {p}.", c)[:limit] for p, c in src_held]
    gen_train = generate_answers(model, tokenizer, train_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed, log)
    gen_held = generate_answers(model, tokenizer, held_prompts, data_cfg["max_new_tokens"], data_cfg["batch_size"], seed + 1, log)
    data = {}
    for tag, seqs in (("train", seqs_train + gen_train), ("heldout_stdlib", seqs_held), ("heldout_answers", gen_held)):
        data[tag] = hidden_states(model, seqs, log, tag)
    torch.save(data, cache)
    log("data: " + ", ".join(f"{k} {v[0].shape[0]} tokens" for k, v in data.items()))
    return data
