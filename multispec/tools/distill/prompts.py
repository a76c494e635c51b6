"""The prompt pool for draft training: text the target will answer, never the evaluation prompts.

Sources: the self-instruct seed tasks, WMT en->de prompts past the first `WMT_HELD_OUT` (the benchmark
uses the first ones), and instruction prompts assembled here from task templates x topics, spread
over MT-Bench's kinds of request (writing, roleplay, reasoning, math, coding, extraction, STEM,
humanities) without using its questions. MT-Bench itself is kept out: it is the held-out set.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

WMT_HELD_OUT = 200

# the parts the instruction prompts are composed from (topics, templates, names, passages, ...)
_PARTS = json.loads(Path(__file__).with_name("prompt_parts.json").read_text(encoding="utf-8"))

TOPICS = _PARTS["topics"]
TEMPLATES = _PARTS["templates"]
NAMES = _PARTS["names"]

# Chat-like requests in the manner of MT-Bench's categories (longer, multi-part, with a persona or a
# format to follow): the first pool was mostly one-line tasks and a draft trained on it transferred
# poorly to MT-Bench (greedy agreement 0.38 on the pool vs 0.21 on MT-Bench).
PLACES = _PARTS["places"]
PERSONAS = _PARTS["personas"]
CONCEPTS = _PARTS["concepts"]
PAIRS = _PARTS["pairs"]
TASKS = _PARTS["tasks"]
CHAT_TEMPLATES = _PARTS["chat_templates"]


# Long, multi-constraint requests: MT-Bench's questions carry a persona or a format, an
# audience and two or three constraints, and a draft trained on one-line tasks agreed with the target
# on 0.52 of pool positions but 0.31 of MT-Bench's. These are composed from parts, one kind per
# MT-Bench category, none from its text (`contaminated` checks that).
FORMS = _PARTS["forms"]
SUBJECTS = _PARTS["subjects"]
AUDIENCES = _PARTS["audiences"]
CONSTRAINTS = _PARTS["constraints"]
CHARACTERS = _PARTS["characters"]
ROLE_OPENERS = _PARTS["role_openers"]
ROLE_QUESTIONS = _PARTS["role_questions"]
HOBBIES = _PARTS["hobbies"]
PROFESSIONS = _PARTS["professions"]
ROLE_TASKS = _PARTS["role_tasks"]
SCIENCE = _PARTS["science"]
FIELDS = _PARTS["fields"]
STEM_TEMPLATES = _PARTS["stem_templates"]
HUMANITIES_TEMPLATES = _PARTS["humanities_templates"]
PASSAGES = _PARTS["passages"]
EXTRACTION_TASKS = _PARTS["extraction_tasks"]
CODING_TASKS = _PARTS["coding_tasks"]
CODING_EXTRAS = _PARTS["coding_extras"]
MATH_TEMPLATES = _PARTS["math_templates"]
REASONING_TEMPLATES = _PARTS["reasoning_templates"]
THINGS = _PARTS["things"]
STREETS = _PARTS["streets"]


def _chat_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b = rng.choice(PAIRS)
        out.append(
            rng.choice(CHAT_TEMPLATES).format(
                place=rng.choice(PLACES),
                persona=rng.choice(PERSONAS),
                concept=rng.choice(CONCEPTS),
                task=rng.choice(TASKS),
                a=a,
                b=b,
            )
        )
    return list(dict.fromkeys(out))  # drop repeats, keep the order


def _reasoning_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        x, y, z = rng.sample(NAMES, 3)
        a, b, c = rng.randint(3, 30), rng.randint(3, 30), rng.randint(2, 9)
        out.append(
            rng.choice(
                [
                    f"{x} is older than {y}, and {y} is older than {z}. Who is the youngest? Explain your reasoning.",
                    f"A box holds {a} red and {b} blue balls. If I draw one ball at random, what is the "
                    f"probability it is "
                    "blue? Show your work.",
                    f"{x} has {a} apples and gives {c} to {y}, who then has twice as many as {z}. {z} has {b} "
                    f"apples. How many "
                    f"apples did {y} have at the start? Think step by step.",
                    f"If it takes {c} machines {c} minutes to make {c} widgets, how long would {a} machines "
                    f"take to make {a} "
                    "widgets? Explain.",
                    f"There are {a} people in a room and each shakes hands with every other person once. How "
                    f"many handshakes "
                    "are there? Explain.",
                    f"A shop raises a price by {a}% and then lowers it by {a}%. Is the final price the same "
                    f"as the original? "
                    "Explain with an example.",
                    f"{x} walks {a} km north, then {b} km east. How far is {x} from the start in a straight line?",
                    f"The average of {c} numbers is {a}. One number, {b}, is removed. What is the average of the rest?",
                ]
            )
        )
    return list(dict.fromkeys(out))


def _math_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        name = rng.choice(NAMES)
        out.append(
            rng.choice(
                [
                    f"What is {a} times {b}? Show your steps.",
                    f"{name} buys {c} notebooks at {a} cents each and pays with a {b + 100}-dollar bill. How "
                    f"much change "
                    "does {name} get? Explain.".replace("{name}", name),
                    f"Solve for x: {a}x + {b} = {a * c + b}.",
                    f"A train travels {a * 10} km in {c} hours. What is its average speed?",
                    f"What is the sum of the integers from 1 to {a}? Explain the method.",
                    f"Is {a * b + 1} a prime number? Explain how you checked.",
                ]
            )
        )
    return out


def _coding_prompts() -> list[str]:
    tasks = [
        "reverses a string",
        "checks whether a number is prime",
        "returns the n-th Fibonacci number",
        "counts the words in a text",
        "merges two sorted lists",
        "finds the largest element of a list",
        "removes duplicates from a list while keeping the order",
        "computes the factorial of n",
        "checks whether a string is a palindrome",
        "converts Celsius to Fahrenheit",
        "returns the most common character in a string",
        "flattens a nested list",
        "computes the greatest common divisor of two integers",
        "sorts a list of dictionaries by a key",
        "reads a CSV file and prints the average of one column",
        "implements binary search",
    ]
    langs = ["Python", "JavaScript", "C++", "Java"]
    return [f"Write a {lang} function that {task}." for task in tasks for lang in langs]


def _extraction_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b = rng.sample(NAMES, 2)
        year = rng.randint(1950, 2023)
        topic = rng.choice(TOPICS)
        out.append(
            rng.choice(
                [
                    f'Extract the names and the year from this sentence: "In {year}, {a} and {b} published a '
                    f'study on {topic}."',
                    f'Return a JSON object with the fields person and subject for: "{a} gave a lecture about {topic}."',
                    f'List the key points of this note as bullets: "{a} will present {topic} on Monday; {b} '
                    f"brings the slides; "
                    f'the budget is {rng.randint(100, 900)} euros."',
                ]
            )
        )
    return out


def _long_prompts(rng: random.Random, n: int) -> list[str]:
    """`n` long requests, the eight kinds in turn (writing, roleplay x2, reasoning, math, coding,
    extraction, STEM, humanities)."""
    out = []
    for i in range(n):
        kind = i % 9
        a, b, c, d = rng.sample(NAMES, 4)
        x, y, w = rng.randint(3, 40), rng.randint(2, 30), rng.randint(3, 12)
        fill = dict(
            topic=rng.choice(TOPICS),
            concept=rng.choice(CONCEPTS),
            concept2=rng.choice(CONCEPTS),
            field=rng.choice(FIELDS),
            task=rng.choice(TASKS),
            hobby=rng.choice(HOBBIES),
            audience_plain=rng.choice(AUDIENCES)[4:],
            science=rng.choice(SCIENCE),
        )
        if kind == 0:
            verb = rng.choice(["Write", "Compose", "Please write", "Could you write", "Help me write", "Create"])
            extra = " ".join(rng.sample(CONSTRAINTS, rng.randint(1, 3)))
            end = "?" if verb.startswith("Could") else "."
            text = f"{verb} a {rng.choice(FORMS)} about {rng.choice(SUBJECTS)} {rng.choice(AUDIENCES)}{end} {extra}"
        elif kind == 1:
            opener = rng.choice(ROLE_OPENERS).format(c=rng.choice(CHARACTERS))
            text = f"{opener} {rng.choice(ROLE_QUESTIONS).format(**fill)}"
        elif kind == 2:
            p, dom, q = rng.choice(PROFESSIONS)
            text = rng.choice(ROLE_TASKS).format(p=p, d=dom, q=q)
        elif kind == 3:
            t1, t2 = rng.choice(THINGS)
            text = rng.choice(REASONING_TEMPLATES).format(a=a, b=b, c=c, d=d, x=x, thing1=t1, thing2=t2)
        elif kind == 4:
            text = rng.choice(MATH_TEMPLATES).format(a_name=a, x=x, xl=x + y + 2, y=y, z=x * rng.randint(1, 5) + y, w=w)
        elif kind == 5:
            lang = rng.choice(["Python", "JavaScript", "C++", "Java", "Rust", "Go"])
            what = rng.choice(["function", "program", "class"])
            text = f"Write a {lang} {what} that {rng.choice(CODING_TASKS)}. {rng.choice(CODING_EXTRAS)}"
        elif kind == 6:
            passage = rng.choice(PASSAGES).format(
                a=a, b=b, n=x, m=y, year=rng.randint(1990, 2024), street=rng.choice(STREETS), place=rng.choice(PLACES)
            )
            text = rng.choice(EXTRACTION_TASKS).format(text=passage)
        elif kind == 7:
            text = rng.choice(STEM_TEMPLATES).format(**fill)
        else:
            text = rng.choice(HUMANITIES_TEMPLATES).format(**fill)
        out.append(text)
    return list(dict.fromkeys(out))


# Data-rich extraction: MT-Bench's extraction questions hand over several records or a long
# text and ask for fields, rankings or a format (JSON, CSV, one line each); the pool's one-passage tasks
# left extraction the weakest category (agreement 0.22). Records here are generated, so answers must copy
# names and numbers from the prompt, which is what the draft has to learn.
FIRMS = _PARTS["firms"]
SURNAMES = _PARTS["surnames"]
TITLE_WORDS = _PARTS["title_words"]
ITEMS = _PARTS["items"]
PRAISE = _PARTS["praise"]
GRIPES = _PARTS["gripes"]
RECORD_TASKS = _PARTS["record_tasks"]
REVIEW_TASKS = _PARTS["review_tasks"]
BOOK_TASKS = _PARTS["book_tasks"]
TABLE_TASKS = _PARTS["table_tasks"]


def _data_prompts(rng: random.Random, n: int) -> list[str]:
    """`n` extraction requests over several generated records: company reports, reviews, works of fiction
    and CSV tables, in turn."""
    out = []
    for i in range(n):
        kind, k = i % 4, rng.randint(3, 5)
        if kind == 0:
            lines = []
            for firm in rng.sample(FIRMS, k):
                revenue = rng.randint(20, 900)
                lines.append(
                    f"{firm}, led by {rng.choice(NAMES)} {rng.choice(SURNAMES)} from {rng.choice(PLACES)}, "
                    f"reported revenue of ${revenue} million and a profit of ${rng.randint(1, revenue // 3)}"
                    f" million in {rng.randint(2015, 2024)}, with {rng.randint(40, 9000)} staff."
                )
            text = rng.choice(RECORD_TASKS).format(text="\n".join(lines))
        elif kind == 1:
            lines = []
            for j, item in enumerate(rng.sample(ITEMS, k)):
                good, bad = rng.sample(PRAISE, rng.randint(0, 2)), rng.sample(GRIPES, rng.randint(0, 2))
                said = " ".join(f"{s[0].upper()}{s[1:]}." for s in rng.sample(good + bad, len(good + bad)))
                lines.append(f"{j + 1}. About the {item}: {said or 'It does what it says.'}")
            text = rng.choice(REVIEW_TASKS).format(text="\n".join(lines))
        elif kind == 2:
            lines, places = [], rng.sample(PLACES, k)
            for place in places:
                title = f"The {rng.choice(TITLE_WORDS[0])} {rng.choice(TITLE_WORDS[1])}"
                lines.append(
                    f"In {title} ({rng.randint(1850, 2023)}), {rng.choice(NAMES)} {rng.choice(SURNAMES)} "
                    f"follows {rng.choice(NAMES)}, {rng.choice(CHARACTERS)}, through {place} "
                    f"in a story about {rng.choice(TOPICS)}."
                )
            text = rng.choice(BOOK_TASKS).format(text="\n".join(lines), place=rng.choice(places))
        else:
            month = rng.choice(["January", "March", "June", "September"])
            lines = ["date,units,revenue"]
            for day in sorted(rng.sample(range(1, 29), k + 2)):
                units = rng.randint(5, 200)
                lines.append(f"{day} {month},{units},{units * rng.randint(3, 40)}")
            text = rng.choice(TABLE_TASKS).format(text="\n".join(lines))
        out.append(text)
    return list(dict.fromkeys(out))


def _self_instruct(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for inst in row.get("instances", [{}]) or [{}]:
            text = row["instruction"]
            if inst.get("input"):
                text += "\n\n" + inst["input"]
            out.append(text)
    return out


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


class Contamination:
    """Whether a training text shares a run of `n` words with any evaluation prompt (MT-Bench's turns):
    such prompts are kept out of training. Six words catch copied phrasing ("an engaging travel blog post
    about") while common short phrases ("is the sum of the") pass."""

    def __init__(self, references: list[str], n: int = 6):
        self.n = n
        self.ngrams = set().union(*(word_ngrams(t, n) for t in references)) if references else set()

    def __call__(self, text: str) -> bool:
        return not self.ngrams.isdisjoint(word_ngrams(text, self.n))

    @classmethod
    def mt_bench(cls, data_dir: Path) -> Contamination:
        path = data_dir / "mt_bench.jsonl"
        if not path.exists():
            return cls([])
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return cls([t for row in rows for t in row["turns"]])


def prompt_pool(data_dir: Path, seed: int = 0) -> list[str]:
    """All training prompts, shuffled with `seed` (same seed, same order), without any that `Contamination`
    finds in MT-Bench."""
    rng = random.Random(seed)
    prompts = [tpl.format(t=t) for tpl in TEMPLATES for t in TOPICS]
    prompts += _math_prompts(rng, 150) + _coding_prompts() + _extraction_prompts(rng, 100)
    prompts += _chat_prompts(rng, 2400) + _reasoning_prompts(rng, 400) + _long_prompts(rng, 3600)
    prompts += _data_prompts(rng, 800)
    seeds = data_dir / "self_instruct_seed_tasks.jsonl"
    if seeds.exists():
        prompts += _self_instruct(seeds)
    wmt = data_dir / "wmt_ende.json"
    if wmt.exists():
        prompts += json.loads(wmt.read_text())[WMT_HELD_OUT:]
    rng.shuffle(prompts)
    contaminated = Contamination.mt_bench(data_dir)
    return [p for p in prompts if not contaminated(p)]


def mt_bench_prompts(data_dir: Path, spread: bool = False, with_categories: bool = False) -> list:
    """MT-Bench's first turns in file order, or with `spread` its categories in turn; with
    `with_categories`, (text, category) pairs."""
    from ..bench.prompts import load_prompts

    path = data_dir / "mt_bench.jsonl"
    if not path.exists():
        raise ValueError(f"held-out prompt file {path} does not exist")
    rows = load_prompts([path], spread=spread)
    return [(p.text, p.category) if with_categories else p.text for p in rows]


def default_data_dir() -> Path:
    from ...data import data_dir

    return data_dir()
