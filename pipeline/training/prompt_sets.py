"""The offline training prompts of draft distillation and of the heads' feature corpus, written here.

Templates and word lists (instructions, maths, coding tasks) and the Python standard library's own
source: nothing that is evaluated (HumanEval, MT-Bench, Spider, Spec-Bench, CNN/DM) can leak into
training. ``build_prompts`` feeds ``pipeline.training.teacher_data``'s sampled answers;
``feature_prompts`` and ``stdlib_chunks`` its feature corpus (unchanged since the shipped heads were
trained, so that a run with the same seed rebuilds the same data).
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])  # the running interpreter's standard library (training text)

# --------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------

TOPICS = [
    "photosynthesis",
    "the French Revolution",
    "black holes",
    "machine learning",
    "climate change",
    "the human immune system",
    "blockchain",
    "the water cycle",
    "volcanoes",
    "the stock market",
    "quantum computing",
    "the Roman Empire",
    "renewable energy",
    "vaccines",
    "the internet",
    "electric cars",
    "coral reefs",
    "inflation",
    "the Renaissance",
    "DNA",
    "earthquakes",
    "social media",
    "meditation",
    "the solar system",
    "artificial intelligence",
    "democracy",
    "the printing press",
    "antibiotics",
    "plate tectonics",
    "jazz music",
    "the Great Wall of China",
    "recycling",
    "sleep",
    "coffee",
    "honeybees",
    "the moon landing",
    "cryptography",
    "gravity",
    "supply and demand",
    "the Olympic Games",
    "rainforests",
    "nuclear energy",
    "the Silk Road",
    "public speaking",
    "time management",
    "healthy eating",
    "remote work",
    "urban gardening",
    "the theory of evolution",
    "ocean currents",
    "3D printing",
    "the Industrial Revolution",
    "volunteering",
    "learning a new language",
    "budgeting",
    "marathon training",
    "video games",
    "smartphones",
    "ancient Egypt",
    "the periodic table",
    "tea",
    "chess",
    "photography",
    "bread baking",
    "dinosaurs",
    "hurricanes",
    "the Amazon river",
    "cloud computing",
    "robots",
    "mindfulness",
    "minimalism",
    "space exploration",
    "the history of mathematics",
    "penguins",
    "wind turbines",
    "online privacy",
    "self-driving cars",
    "pollination",
    "the human brain",
    "composting",
    "classical music",
    "the Cold War",
    "microplastics",
    "open source software",
]
AUDIENCES = [
    "a 10-year-old",
    "a high school student",
    "a busy professional",
    "a beginner",
    "an expert",
    "my grandmother",
    "a new employee",
    "a university student",
]
THINGS = [
    "a small bakery",
    "a mobile app",
    "a local library",
    "a bicycle shop",
    "a yoga studio",
    "a science fair project",
    "a birthday party",
    "a team offsite",
    "a podcast",
    "a charity run",
    "a community garden",
    "an online course",
    "a board game night",
    "a hiking trip",
    "a book club",
]
PEOPLE = [
    "my manager",
    "a customer",
    "a landlord",
    "a professor",
    "a colleague",
    "a friend",
    "a neighbour",
    "the city council",
    "a job recruiter",
    "my team",
]
REASONS = [
    "asking for a deadline extension",
    "thanking them for their help",
    "declining an invitation",
    "requesting a meeting",
    "reporting a problem",
    "apologizing for a delay",
    "asking for a reference",
    "proposing a new idea",
    "following up on an interview",
    "announcing a schedule change",
]

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
    "reverses a string",
    "checks whether a number is prime",
    "computes the factorial of n",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "merges two sorted lists",
    "removes duplicates from a list while keeping order",
    "finds the largest element of a list",
    "checks whether a string is a palindrome",
    "flattens a nested list",
    "computes the greatest common divisor",
    "converts Celsius to Fahrenheit",
    "sorts a list of dictionaries by a key",
    "counts word frequencies in a text",
    "finds the second largest number in a list",
    "transposes a matrix",
    "checks whether two strings are anagrams",
    "returns the sum of the digits of an integer",
    "implements binary search",
    "implements bubble sort",
    "implements quicksort",
    "implements merge sort",
    "reads a CSV file and returns the rows as dictionaries",
    "validates an email address with a regular expression",
    "computes the average of a list of numbers",
    "finds all pairs in a list that sum to a target",
    "rotates a list by k positions",
    "returns the longest common prefix of a list of strings",
    "converts a Roman numeral to an integer",
    "converts an integer to binary without using bin()",
    "checks whether parentheses are balanced",
    "computes the median of a list",
    "finds the most common element in a list",
    "capitalizes every word",
    "computes the power set of a list",
    "generates all permutations of a string",
    "chunks a list into pieces of size n",
    "computes running totals of a list",
    "returns the indices of the minimum values",
    "counts the lines in a file",
    "parses a date string and returns the weekday",
    "implements a stack class",
    "implements a queue with two stacks",
    "implements a simple LRU cache",
    "computes the dot product of two vectors",
    "multiplies two matrices",
    "checks whether a year is a leap year",
    "computes the Levenshtein distance between two strings",
    "finds the missing number in a list from 1 to n",
    "returns the prime factors of a number",
    "converts a string to snake_case",
    "converts snake_case to camelCase",
    "computes compound interest",
    "returns the n largest elements of a list",
    "groups a list of words by their first letter",
    "checks whether a list is sorted",
    "computes the area of a circle",
    "finds the intersection of two lists",
    "computes the Collatz sequence of a number",
    "returns the words of a sentence longer than k characters",
    "counts the number of islands in a grid",
    "evaluates a postfix expression",
    "implements a linked list",
    "finds the longest increasing subsequence",
    "computes Pascal's triangle",
    "encrypts text with a Caesar cipher",
    "returns the unique characters of a string",
    "zips two lists into a dictionary",
    "computes the mode of a list",
    "checks whether a number is a perfect square",
    "sums the even numbers in a list",
    "finds the shortest word",
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
        (
            f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} gives away {c}. How many {item} does {n1} "
            "have now?"
        ),
        (
            f"A shop sells {item} for ${c} each. {n1} buys {a} of them and pays with ${a * c + b}. How much change "
            f"does {n1} get?"
        ),
        f"If {a} workers can build a wall in {b} days, how long would {a + c} workers take? Explain your reasoning.",
        f"Solve for x: {a}x + {b} = {a * c + b}.",
        f"What is {a} multiplied by {b}, plus {c}? Show your work.",
        (
            f"A train travels at {a} km/h for {c} hours and then at {b} km/h for {c} more hours. What distance does it "
            "cover?"
        ),
        f"{n1} reads {c} pages a day. How many days does {n1} need to finish a book of {a * c + b} pages?",
        f"What is the probability of rolling a sum of {rng.randint(2, 12)} with two fair dice?",
        f"Find the area and the perimeter of a rectangle that is {a} cm long and {b} cm wide.",
        f"Is {a * b + c} a prime number? Explain.",
    ]
    return rng.choice(forms)


@functools.cache  # parsing the standard library takes seconds; the result depends only on max_chars
def stdlib_functions(max_chars: int = 1800) -> tuple[tuple[str, str, str, str], ...]:
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
    funcs = stdlib_functions()
    prompts = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.40:
            t1, t2 = rng.sample(TOPICS, 2)
            prompts.append(
                rng.choice(INSTRUCTION_TEMPLATES).format(
                    topic=t1,
                    topic2=t2,
                    audience=rng.choice(AUDIENCES),
                    thing=rng.choice(THINGS),
                    person=rng.choice(PEOPLE),
                    reason=rng.choice(REASONS),
                )
            )
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
            prompts.append(
                rng.choice(
                    [
                        "Explain what this Python code does:\n```python\n{src}\n```",
                        "Find possible bugs or improvements in this code:\n{src}",
                        "Add comments to this function:\n```python\n{src}\n```",
                    ]
                ).format(src=source[:900])
            )
    return prompts


FEATURE_TOPICS = [
    "tides",
    "glaciers",
    "the printing of books",
    "solar panels",
    "bicycles",
    "typography",
    "origami",
    "the immune response",
    "beekeeping",
    "lighthouses",
    "sourdough",
    "submarines",
    "compilers",
    "hash tables",
    "version control",
    "unit testing",
    "regular expressions",
    "spreadsheets",
    "bird migration",
    "rainbows",
    "thunderstorms",
    "fermentation",
    "caves",
    "deserts",
    "satellites",
    "libraries",
    "maps",
    "clocks",
    "trains",
    "bridges",
    "recycling paper",
    "word processors",
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
    "counts the vowels in a string",
    "merges two sorted lists",
    "computes a moving average",
    "parses a date in YYYY-MM-DD format",
    "flattens a nested list",
    "checks whether a year is a leap year",
    "converts Celsius to Fahrenheit for a list of values",
    "removes duplicate lines from a text file",
    "finds the most common word in a paragraph",
    "validates a simple email address",
    "computes the greatest common divisor of two numbers",
    "transposes a matrix given as a list of lists",
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


def stdlib_chunks(
    n_files_train: int, n_files_heldout: int, max_chars: int, seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) lists of (relative path, source chunk) from different stdlib files."""
    root = STDLIB
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "test" not in p.parts
        and "tests" not in p.parts
        and "site-packages" not in p.parts
        and "idlelib" not in p.parts
        and p.stat().st_size > 2000
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
