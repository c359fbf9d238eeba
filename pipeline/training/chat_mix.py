"""A broad chat prompt mix for draft distillation: what users ask a chat model, written here.

The draft shipped first was distilled on instructions, maths, coding tasks and standard-library
completions (``prompt_sets.build_prompts``); on real chat prompts (MT-Bench-like first and second turns)
its acceptance falls. This mix covers the categories of the public chat benchmarks (MT-Bench's eight:
writing, roleplay, reasoning, maths, coding, extraction, STEM, humanities; Spec-Bench's summarization and
question answering) in proportions close to theirs, and about 40% of the conversations have a second
user turn that refers to the target's own first answer (the multi-turn shape of MT-Bench).

Everything is templated from the word lists below (and, for some coding and summarization prompts, the
Python standard library's own functions and module docstrings), so nothing evaluated can leak in;
``pipeline.training.contamination`` checks that at run time anyway.

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
# Word lists
# --------------------------------------------------------------------------------------------------

NAMES = [
    "Alice",
    "Bruno",
    "Chen",
    "Dara",
    "Elif",
    "Felix",
    "Gita",
    "Hamid",
    "Ivy",
    "Jonas",
    "Kofi",
    "Lena",
    "Mateo",
    "Nadia",
    "Oscar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tomas",
    "Uma",
    "Viktor",
    "Wen",
    "Yara",
    "Zoe",
]
CITIES = [
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Toronto",
    "Prague",
    "Lima",
    "Melbourne",
    "Marrakesh",
    "Oslo",
    "Hanoi",
    "Buenos Aires",
    "Edinburgh",
    "Seoul",
    "Cape Town",
    "Vancouver",
    "Istanbul",
    "Dublin",
    "Mexico City",
    "Copenhagen",
    "Singapore",
]
GENERAL_TOPICS = [
    "urban gardening",
    "remote work",
    "public libraries",
    "electric bicycles",
    "board games",
    "minimalism",
    "the four-day work week",
    "learning to cook",
    "volunteering",
    "night trains",
    "houseplants",
    "podcasts",
    "second-hand fashion",
    "community radio",
    "birdwatching",
    "tiny houses",
    "street food",
    "digital detox",
    "running a marathon",
    "learning a second language",
    "saving money",
    "adopting a pet",
    "solo travel",
    "starting a small business",
    "open-plan offices",
    "online dating",
    "homeschooling",
    "camping",
    "making pottery",
    "journaling",
    "chess",
    "video game music",
    "local elections",
    "car-free city centres",
    "smart watches",
    "sourdough baking",
    "cold showers",
    "reading fiction",
    "coffee culture",
    "tea ceremonies",
]
AUDIENCES = [
    "a ten-year-old",
    "a teenager",
    "a busy parent",
    "a retired engineer",
    "a first-year student",
    "a small-business owner",
    "a non-native English speaker",
    "my grandfather",
    "a new colleague",
    "a sceptical friend",
]
TONES = [
    "a humorous",
    "a formal",
    "an enthusiastic",
    "a calm and reassuring",
    "a poetic",
    "a persuasive",
    "a nostalgic",
    "a matter-of-fact",
    "a friendly",
    "a dramatic",
]
WRITING_FORMS = [
    "blog post",
    "short story",
    "poem",
    "product description",
    "cover letter",
    "wedding toast",
    "op-ed",
    "newsletter introduction",
    "limerick",
    "song chorus",
    "speech",
    "diary entry",
    "travel guide entry",
    "letter to the editor",
    "social media post",
    "movie synopsis",
    "restaurant review",
    "children's story",
    "motivational message",
    "press release",
]
WRITING_TEMPLATES = [
    "Write a {form} about {topic}.",
    "Write a {form} about {topic} for {audience}.",
    "Compose {tone} {form} about {topic}, in under 200 words.",
    "Draft a {form} that encourages people to try {topic}.",
    "Write a {form} set in {city} that involves {topic}.",
    "Can you help me write a {form} about {topic}? Keep it short and use {tone} tone.",
    "I need a {form} on the subject of {topic}. Make it engaging and end with a question.",
    "Write {tone} {form} from the point of view of someone who just discovered {topic}.",
    "Write a {form} about my trip to {city}.",
    "Please write a {form} announcing that our team is starting a project on {topic}.",
]
EMAIL_PEOPLE = [
    "my landlord",
    "a customer",
    "my manager",
    "a professor",
    "the hiring committee",
    "my neighbour",
    "a supplier",
    "the school principal",
    "an old friend",
    "the city council",
]
EMAIL_REASONS = [
    "asking for a deadline extension",
    "apologizing for a late delivery",
    "declining an invitation politely",
    "asking for a refund",
    "requesting a meeting next week",
    "thanking them for their support",
    "reporting a broken heater",
    "proposing a new idea",
    "following up on a job interview",
    "complaining about noise at night",
    "asking for a letter of recommendation",
    "announcing a schedule change",
]
WRITING_FOLLOWUPS = [
    "Now make it about half as long.",
    "Rewrite it in a more formal tone.",
    "Make it funnier.",
    "Add a catchy title.",
    "Rewrite your previous answer so that it rhymes.",
    "Turn it into a bulleted list of key points.",
    "Rewrite it for {audience}.",
    "Can you end it with a surprising twist?",
    "Now write a short reply to it.",
    "Critique your previous answer and give an improved version.",
    "Translate the first two sentences into simple English.",
    "Rewrite it without using the letter 'e' in the first sentence.",
]

PERSONAS = [
    "a pirate captain",
    "a medieval knight",
    "a travel agent",
    "a personal fitness coach",
    "a detective in 1920s Chicago",
    "a friendly robot",
    "a chef at a busy Italian restaurant",
    "a museum guide",
    "a startup founder pitching to investors",
    "a nervous job candidate",
    "an astronaut on a space station",
    "a wizard who teaches at a magic school",
    "a customer support agent for an internet provider",
    "a sports commentator",
    "a grumpy cat",
    "a time traveller from the year 2300",
    "a librarian",
    "a park ranger",
    "a kindergarten teacher",
    "a stand-up comedian",
    "a ship's doctor",
    "a gardener",
    "a tour guide in {city}",
    "a career counsellor",
    "a news anchor",
    "a dragon guarding a treasure",
    "a barista",
    "a Victorian-era inventor",
    "a meditation teacher",
    "a video game character who just became self-aware",
]
ROLEPLAY_TEMPLATES = [
    "Pretend you are {persona}. Introduce yourself and describe a typical day.",
    'You are {persona}. A visitor asks you: "What do you like most about your work?" Answer in character.',
    "Act as {persona} and give me advice about {topic}.",
    "Role-play as {persona}. I am a customer who is unhappy about a delay. Respond to me.",
    "Imagine you are {persona}. Explain {topic} in your own words.",
    "Stay in character as {persona} and tell me a short story from your past.",
    "Let's play a game: you are {persona} and I am a new apprentice. Give me my first three tasks.",
    "Speak as {persona} would and convince me to visit {city}.",
    "From now on you are {persona}. What is your biggest fear?",
    "Pretend to be {persona} writing a short letter to a friend about {topic}.",
]
ROLEPLAY_FOLLOWUPS = [
    "Stay in character. What is the hardest part of your job?",
    'Now I say: "I don\'t believe you." How do you answer?',
    "Describe your favourite memory, still in character.",
    "What advice would you give to someone starting out?",
    "Tell me a joke that your character would tell.",
    "Now drop the character and explain what you just did.",
    "Continue the conversation: I ask you to help me with a problem at home.",
    "How would you describe {city}?",
    "What would you do if you lost everything tomorrow?",
    "Stay in character and say goodbye to me.",
]

OBJECTS = ["red box", "blue ball", "green cup", "yellow book", "black hat", "white vase", "orange key", "purple pen"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DIRECTIONS = ["north", "east", "south", "west"]
REASONING_FOLLOWUPS = [
    "Explain your reasoning step by step.",
    "Are you sure? Check your answer again.",
    "How would the answer change if there were one more person involved?",
    "Explain it in a way a child could follow.",
    "Can you come up with a similar puzzle and solve it?",
    "What assumption did you make, and is it justified?",
]

ITEMS = [
    "apples",
    "notebooks",
    "pencils",
    "concert tickets",
    "marbles",
    "cookies",
    "stamps",
    "coins",
    "shirts",
    "plants",
    "candles",
    "bottles of juice",
    "tennis balls",
    "bus passes",
    "sandwiches",
]
MATH_FOLLOWUPS = [
    "Now double every number in the problem. What is the new answer?",
    "Can you check the answer in another way?",
    "Write a similar problem and solve it.",
    "Explain the steps to someone who finds maths hard.",
    "What if the last number were 5 larger?",
    "Express the answer as a percentage of the first number.",
]

LANGS = ["Python", "Python", "Python", "JavaScript", "TypeScript", "SQL", "C", "C++", "Java", "Go", "Rust", "Bash"]
CODING_TASKS = [
    "reverses the words of a sentence",
    "checks whether a string is a valid IPv4 address",
    "computes a moving average",
    "finds the k most frequent words in a text",
    "merges overlapping intervals",
    "validates a credit card number with the Luhn algorithm",
    "converts a number to its English words",
    "finds the longest substring without repeating characters",
    "parses a query string into a dictionary",
    "computes the edit distance between two strings",
    "implements a min-heap",
    "serializes a binary tree to a string and back",
    "returns the n-th row of Pascal's triangle",
    "groups anagrams together",
    "removes duplicate rows from a CSV file",
    "rate-limits calls to a function",
    "implements a trie with insert and search",
    "finds all prime numbers below n with a sieve",
    "flattens a nested dictionary with dotted keys",
    "checks whether a Sudoku board is valid",
    "computes the day of the week for a date",
    "downloads a web page and counts its links",
    "retries a function call with exponential backoff",
    "splits a list into chunks of size n",
    "finds the shortest path in an unweighted graph",
    "converts a hex colour to RGB",
    "computes the median of a stream of numbers",
    "formats a duration in seconds as hours, minutes and seconds",
    "implements a simple bank account class",
    "detects a cycle in a linked list",
    "finds the maximum sum of a contiguous subarray",
    "generates a random password",
    "counts the lines, words and characters of a file",
    "implements memoization as a decorator",
    "checks whether two rectangles overlap",
    "converts Roman numerals to integers and back",
]
CODING_CONCEPTS = [
    "recursion",
    "closures",
    "a race condition",
    "the difference between a process and a thread",
    "big-O notation",
    "garbage collection",
    "dependency injection",
    "the difference between a list and a tuple in Python",
    "REST APIs",
    "database indexes",
    "immutability",
    "unit tests versus integration tests",
    "git rebase versus merge",
    "a hash map",
    "async/await",
    "SQL joins",
    "object-oriented inheritance",
    "memory leaks",
    "regular expressions",
    "continuous integration",
    "caching",
    "the event loop in JavaScript",
    "type hints",
    "pointers",
]
CODING_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}. Include comments and an example call.",
    "How would I write a program in {lang} that {task}?",
    "Implement a function that {task} in {lang} and explain its time complexity.",
    "I'm learning {lang}. Can you show me code that {task}?",
    "Write a Python function that {task}, with type hints and a docstring.",
    "Explain {concept} with a short {lang} example.",
    "What is {concept}? Give a simple example.",
    "Write unit tests for a Python function that {task}.",
    "Review this approach: I want a function that {task}. What edge cases should I handle?",
]
SQL_TABLES = [
    ("employees", ["id", "name", "department", "salary", "hire_date"]),
    ("orders", ["order_id", "customer_id", "amount", "order_date", "status"]),
    ("books", ["isbn", "title", "author", "year", "price"]),
    ("students", ["student_id", "name", "grade", "city", "enrolled_on"]),
    ("flights", ["flight_no", "origin", "destination", "departure", "seats"]),
    ("products", ["sku", "name", "category", "price", "stock"]),
]
SQL_ASKS = [
    "the average {num} per {cat}",
    "the five rows with the highest {num}",
    "how many rows there are for each {cat}",
    "all rows where {num} is above the average",
    "the total {num} grouped by {cat}, largest first",
]
CODING_FOLLOWUPS = [
    "Now add error handling for invalid input.",
    "Can you make it faster?",
    "Rewrite it in {lang}.",
    "Write three unit tests for it.",
    "Explain the code line by line.",
    "What is its time and space complexity?",
    "Make it work for very large inputs.",
    "Add type hints and a docstring.",
]

EXTRACTION_KINDS = [
    "receipt",
    "meeting notes",
    "job posting",
    "event announcement",
    "product reviews",
    "travel itinerary",
    "customer emails",
    "lab report",
]
PRODUCTS = [
    "wireless earbuds",
    "a standing desk",
    "a coffee grinder",
    "a rain jacket",
    "a board game",
    "a blender",
    "a phone case",
    "hiking boots",
    "a desk lamp",
    "a yoga mat",
    "an e-reader",
    "a backpack",
]
COMPANIES = [
    "Northwind Ltd",
    "Bluefin Labs",
    "Acorn & Co",
    "Solaris Energy",
    "Pine Street Bakery",
    "Vertex Robotics",
    "Harbor Logistics",
    "Maple Health",
    "Quill Publishing",
    "Orbit Games",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
EXTRACTION_ASKS = [
    "Extract every person's name and the date mentioned with it, as JSON.",
    "List all amounts of money in the text, with what each is for.",
    "Return the key facts as a table with columns field and value.",
    "Extract the names of companies and products, one per line.",
    "For each review, give the product, a rating from 1 to 5 and the sentiment (positive, negative or neutral).",
    "Which dates and places are mentioned? Answer in YAML.",
    "Pull out all action items and who is responsible for each.",
    "Summarize the text in one sentence, then list every number in it.",
]
EXTRACTION_FOLLOWUPS = [
    "Now format the same information as CSV.",
    "Sort the entries by date.",
    "Only keep the entries that involve money.",
    "Which of these items is the most important, and why?",
    "Convert your answer to a Markdown table.",
    "Did you miss anything? Check the text again.",
]

STEM_SUBJECTS = [
    "photosynthesis",
    "entropy",
    "Ohm's law",
    "natural selection",
    "how vaccines train the immune system",
    "plate tectonics",
    "the greenhouse effect",
    "black holes",
    "how a transistor works",
    "DNA replication",
    "the Doppler effect",
    "Newton's third law",
    "chemical equilibrium",
    "how batteries store energy",
    "the water cycle",
    "machine learning",
    "how GPS finds your position",
    "nuclear fusion",
    "the speed of light",
    "enzymes",
    "antibiotic resistance",
    "how airplanes fly",
    "ocean tides",
    "the periodic table",
    "quantum entanglement",
    "how the heart pumps blood",
    "climate feedback loops",
    "compound interest",
    "how neural networks learn",
    "why the sky is blue",
    "radioactive decay",
    "the carbon cycle",
    "how a refrigerator works",
    "sound waves",
    "friction",
    "the structure of an atom",
    "how rainbows form",
    "why ice floats",
    "how solar panels work",
    "the human microbiome",
]
STEM_TEMPLATES = [
    "Explain {subject} in simple terms.",
    "How does {subject} work?",
    "What is {subject}, and why does it matter?",
    "Explain {subject} to {audience}.",
    "What are common misconceptions about {subject}?",
    "Give me a real-world example of {subject}.",
    "Write a short lesson plan about {subject}.",
    "Compare {subject} and {subject2}.",
    "What questions do scientists still ask about {subject}?",
    "Describe an experiment that demonstrates {subject}.",
]
STEM_FOLLOWUPS = [
    "Give me a real-world example.",
    "Explain it in simpler terms.",
    "What is a common mistake people make about this?",
    "Can you write a short quiz about it?",
    "How is this used in industry?",
    "Summarize your answer in three bullet points.",
]

HUMANITIES_SUBJECTS = [
    "the Renaissance",
    "the Industrial Revolution",
    "the fall of the Roman Empire",
    "the printing press",
    "the Silk Road",
    "utilitarianism",
    "stoicism",
    "the French Revolution",
    "impressionist painting",
    "the Cold War",
    "the Harlem Renaissance",
    "supply and demand",
    "inflation",
    "the role of myths in ancient Greece",
    "existentialism",
    "the history of jazz",
    "colonialism in Africa",
    "the Meiji Restoration",
    "the Enlightenment",
    "Shakespeare's tragedies",
    "the Bauhaus movement",
    "the social contract",
    "globalization",
    "the history of the Olympic Games",
    "the Magna Carta",
    "minimalist music",
    "the ethics of artificial intelligence",
    "free will",
    "the invention of writing",
    "the Ottoman Empire",
    "the civil rights movement",
    "behavioural economics",
    "the Protestant Reformation",
    "Romantic poetry",
]
HUMANITIES_TEMPLATES = [
    "What were the main causes and consequences of {subject}?",
    "Discuss {subject} and its influence today.",
    "Explain {subject} to {audience}.",
    "Compare {subject} with {subject2}.",
    "What can we learn from {subject}?",
    "Give three arguments for and three against the importance of {subject}.",
    "Write a short essay outline about {subject}.",
    "Who were the key figures of {subject}, and what did they do?",
    "How would you teach {subject} in one lesson?",
    "What are the main criticisms of {subject}?",
]
HUMANITIES_FOLLOWUPS = [
    "How does this relate to today's world?",
    "Which source would you recommend reading first, and why?",
    "Give a counterargument to your main point.",
    "Summarize your answer in two sentences.",
    "Write a short dialogue between two people who disagree about this.",
    "What is the most surprising fact about it?",
]

NEWS_SENTENCES = [
    "The city council of {city} voted on {weekday} to approve a plan for {topic}.",
    "Officials said the project will cost about {money} and take {n} months to complete.",
    '{name}, who leads a local group, called the decision "a long overdue step".',
    "Critics argue that the money should instead go to schools and public transport.",
    "A survey last {month} found that {pct} percent of residents supported the idea.",
    "The first phase is expected to start in {month}, weather permitting.",
    "{company} has offered to provide equipment at a reduced price.",
    "Similar programmes in other cities have had mixed results, according to a recent study.",
    "{name2} said the plan would mostly benefit families with young children.",
    "The council will publish a progress report every {n} weeks.",
    "Several shop owners worry that construction will reduce the number of visitors.",
    "Supporters say {topic} could bring new life to neighbourhoods that have been neglected for years.",
    "The mayor promised that no existing services would be cut to pay for the plan.",
    "Local students will be invited to help design parts of the project.",
]
SUMMARY_ASKS = [
    "Summarize the following text in two sentences:\n\n{text}",
    "TL;DR:\n\n{text}",
    "Give three bullet points that capture the main ideas of this text.\n\n{text}",
    "Write a headline and a one-paragraph summary for this article:\n\n{text}",
    "{text}\n\nSummarize the passage above for {audience}.",
    "What is the main point of this text?\n\n{text}",
]
SUMMARY_FOLLOWUPS = [
    "Now summarize it in one sentence.",
    "What information is missing from the text?",
    "Rewrite your summary as a tweet.",
    "Which claim in the text would you want to check first?",
    "List the people or organizations mentioned.",
]

COUNTRIES = [
    "Portugal",
    "Kenya",
    "Japan",
    "Canada",
    "Chile",
    "Vietnam",
    "Norway",
    "Morocco",
    "New Zealand",
    "Peru",
    "Ireland",
    "Ghana",
    "Finland",
    "Argentina",
    "Thailand",
    "Poland",
    "Egypt",
    "Iceland",
    "Colombia",
    "Nepal",
]
INGREDIENTS = [
    "rice",
    "eggs",
    "spinach",
    "chickpeas",
    "tomatoes",
    "potatoes",
    "lentils",
    "cheese",
    "mushrooms",
    "tofu",
    "pasta",
    "carrots",
    "onions",
    "yoghurt",
    "chicken",
    "beans",
]
EVENTS = [
    "a job interview",
    "moving to a new city",
    "my final exams",
    "a difficult conversation with a friend",
    "public speaking",
    "starting a new job",
    "a long flight",
    "my first marathon",
    "a family reunion",
    "a wedding speech",
]
QA_TEMPLATES = [
    "What is the capital of {country}, and what is it known for?",
    "What should I cook for dinner with {ing1}, {ing2} and {ing3}?",
    "I'm nervous about {event}. Any advice?",
    "Plan a three-day trip to {city} on a budget.",
    "Recommend five books about {topic}.",
    "What are some good habits for {topic}?",
    "What's the best way to get started with {topic}?",
    "Is {topic} worth it? Give me an honest answer.",
    "Tell me something interesting about {country}.",
    "How do I prepare for {event}?",
    "What are the pros and cons of {topic}?",
    "Give me a packing list for a week in {city}.",
]
QA_FOLLOWUPS = [
    "Thanks! Can you make that shorter?",
    "What would you do differently on a tight budget?",
    "Why do you think so?",
    "Can you give me more details on the first point?",
    "What if I only have one day?",
    "Any other suggestions?",
]

GENERIC_FOLLOWUPS = [
    "Can you explain that more simply?",
    "Give me a short summary of your answer.",
    "What is the most important point in your answer?",
    "Can you give an example?",
]


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
        first = f"{a} is taller than {b}. {c} is shorter than {b} but taller than {d}. Who is the tallest, and who is the shortest?"
    elif kind == 1:
        day, n = rng.choice(WEEKDAYS), rng.randint(3, 40)
        first = f"If today is {day}, what day of the week will it be in {n} days? Explain how you got it."
    elif kind == 2:
        steps = [(rng.randint(1, 9), rng.choice(DIRECTIONS)) for _ in range(rng.randint(2, 4))]
        path = ", then ".join(f"{k} km {d}" for k, d in steps)
        first = f"{names[0]} walks {path}. How far is {names[0]} from the starting point in a straight line, and in which direction?"
    elif kind == 3:
        objs = pools.sample(rng, OBJECTS, 3)
        first = (
            f"There are three boxes in a row. The {objs[0]} is not in the first box. The {objs[1]} is to the right of the "
            f"{objs[0]}. The {objs[2]} is in the first box. Which object is in each box?"
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
        f"{n1} buys {a} {item} at ${c} each and sells them all for ${a * c + b * c}. What is the profit as a percentage of the cost?",
        f"{n1} had some {item}. After giving {b} to {n2} and buying {c} more, {n1} has {a}. How many did {n1} start with?",
        f"Solve the system of equations: x + y = {a + b}, x - y = {a - b}.",
        f"Solve for x: {c}x - {b} = {c * a - b}. Show each step.",
        f"A rectangle has a perimeter of {2 * (a + b)} cm and one side of {a} cm. What is its area?",
        f"What is {a}% of {b * 50}? And what percentage of {b * 50} is {a * b // 2}?",
        f"A car uses {c} litres of fuel per 100 km. How much fuel does it need for {a * 10} km, and what does it cost at ${b / 20:.2f} per litre?",
        f"Find the mean and the median of these numbers: {', '.join(str(rng.randint(1, 99)) for _ in range(rng.randint(5, 9)))}.",
        f"Two dice are rolled. What is the probability that the sum is at least {rng.randint(5, 11)}?",
        f"Simplify the fraction {a * c}/{b * c} and write it as a decimal.",
        f"A recipe for {c} people needs {b * 10} g of flour. How much flour is needed for {a} people?",
        f"What is the sum of all integers from 1 to {a * 10}?",
        f"Compute the derivative of f(x) = {c}x^3 - {b}x^2 + {a}x and find f'(1).",
        f"A savings account pays {c}% interest per year, compounded yearly. How much will ${a * 100} be worth after {rng.randint(2, 6)} years?",
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
            f"{comp} is hiring a {rng.choice(['data analyst', 'junior developer', 'office manager', 'nurse', 'sales lead'])} "
            f"in {city}. Salary: {rng.randint(30, 90)},000 per year. Start date: {month} {day}. "
            f"Apply by sending your CV to {n[0].lower()}@{comp.split()[0].lower()}.example. "
            f"Requirements: {rng.randint(1, 6)} years of experience and fluent English."
        )
    if kind == "event announcement":
        return (
            f"Join us for the {city} {pools.pick(rng, GENERAL_TOPICS)} festival on {month} {day}! Doors open at "
            f"{rng.randint(9, 19)}:00. Tickets cost {money()} ({money()} for students). Speakers include {n[0]} and {n[1]}. "
            f"Sponsored by {comp}."
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
            f"Passenger: {n[0]}. Flight from {city} to {c2} on {month} {day}, departing {rng.randint(6, 22)}:{rng.choice(['05', '20', '45'])}. "
            f"Hotel: {comp} Inn, {rng.randint(2, 7)} nights, {money()} per night. Return flight on {rng.choice(MONTHS)} {rng.randint(1, 28)}."
        )
    if kind == "customer emails":
        return (
            f"From: {n[0]}\nHi, I ordered {pools.pick(rng, PRODUCTS)} on {month} {day} (order #{rng.randint(10000, 99999)}) "
            f"and paid {money()}, but it has not arrived in {city} yet.\n\nFrom: {n[1]}\nHello {comp}, I would like to "
            f"return {pools.pick(rng, PRODUCTS)}; it is the wrong size."
        )
    return (
        f"Lab report by {n[0]} and {n[1]}, {month} {day}. Sample A weighed {rng.randint(10, 99)}.{rng.randint(0, 9)} g; "
        f"sample B {rng.randint(10, 99)}.{rng.randint(0, 9)} g. Heated to {rng.randint(40, 300)} degrees C for "
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
