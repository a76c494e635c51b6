"""The prompt pool for draft training: text the target will answer, never the evaluation prompts.

Sources: the self-instruct seed tasks, WMT en->de prompts past the first `WMT_HELD_OUT` (the benchmark
uses the first ones), and instruction prompts assembled here from task templates x topics, spread
over MT-Bench's kinds of request (writing, roleplay, reasoning, math, coding, extraction, STEM,
humanities) without using its questions. MT-Bench itself is kept out: it is the held-out set.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WMT_HELD_OUT = 200

TOPICS = [
    "the water cycle", "black holes", "the French Revolution", "photosynthesis", "machine learning",
    "climate change", "the Roman Empire", "volcanoes", "the human immune system", "renewable energy",
    "the stock market", "coral reefs", "the printing press", "honeybees", "quantum computing",
    "the Silk Road", "sleep", "electric cars", "ancient Egypt", "vaccines", "the Moon landing",
    "supply and demand", "the internet", "dinosaurs", "jazz music", "the Olympic Games", "recycling",
    "earthquakes", "the Renaissance", "coffee", "smartphones", "rainforests", "the theory of evolution",
    "democracy", "chess", "meditation", "inflation", "glaciers", "social media", "the periodic table",
    "a small bakery", "remote work", "space tourism", "urban gardening", "public libraries",
    "the history of tea", "artificial sweeteners", "volunteering", "learning a new language",
    "marathon training", "city traffic", "board games", "the deep ocean", "wind turbines",
]
TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "Write a short blog post about {t}.",
    "Give me five interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Write a short poem about {t}.",
    "Summarize the history of {t} in a few sentences.",
    "Write a persuasive paragraph arguing that everyone should learn about {t}.",
    "Pretend you are a tour guide and describe {t} to a group of visitors.",
    "Write three quiz questions with answers about {t}.",
    "Compose a friendly email inviting a colleague to a talk about {t}.",
    "What are common misconceptions about {t}?",
    "Describe {t} in the style of a news report.",
    "Write a dialogue between a student and a teacher about {t}.",
    "How would you explain the importance of {t} to a policy maker?",
]
NAMES = ["Alice", "Bob", "Carmen", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas"]


def _math_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        name = rng.choice(NAMES)
        out.append(rng.choice([
            f"What is {a} times {b}? Show your steps.",
            f"{name} buys {c} notebooks at {a} cents each and pays with a {b + 100}-dollar bill. How much change "
            "does {name} get? Explain.".replace("{name}", name),
            f"Solve for x: {a}x + {b} = {a * c + b}.",
            f"A train travels {a * 10} km in {c} hours. What is its average speed?",
            f"What is the sum of the integers from 1 to {a}? Explain the method.",
            f"Is {a * b + 1} a prime number? Explain how you checked.",
        ]))
    return out


def _coding_prompts() -> list[str]:
    tasks = [
        "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
        "counts the words in a text", "merges two sorted lists", "finds the largest element of a list",
        "removes duplicates from a list while keeping the order", "computes the factorial of n",
        "checks whether a string is a palindrome", "converts Celsius to Fahrenheit",
        "returns the most common character in a string", "flattens a nested list",
        "computes the greatest common divisor of two integers", "sorts a list of dictionaries by a key",
        "reads a CSV file and prints the average of one column", "implements binary search",
    ]
    langs = ["Python", "JavaScript", "C++", "Java"]
    return [f"Write a {lang} function that {task}." for task in tasks for lang in langs]


def _extraction_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b = rng.sample(NAMES, 2)
        year = rng.randint(1950, 2023)
        topic = rng.choice(TOPICS)
        out.append(rng.choice([
            f"Extract the names and the year from this sentence: \"In {year}, {a} and {b} published a study on {topic}.\"",
            f"Return a JSON object with the fields person and subject for: \"{a} gave a lecture about {topic}.\"",
            f"List the key points of this note as bullets: \"{a} will present {topic} on Monday; {b} brings the slides; "
            f"the budget is {rng.randint(100, 900)} euros.\"",
        ]))
    return out


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


def prompt_pool(data_dir: Path, seed: int = 0) -> list[str]:
    """All training prompts, shuffled with `seed` (same seed, same order)."""
    rng = random.Random(seed)
    prompts = [tpl.format(t=t) for tpl in TEMPLATES for t in TOPICS]
    prompts += _math_prompts(rng, 150) + _coding_prompts() + _extraction_prompts(rng, 100)
    seeds = data_dir / "self_instruct_seed_tasks.jsonl"
    if seeds.exists():
        prompts += _self_instruct(seeds)
    wmt = data_dir / "wmt_ende.json"
    if wmt.exists():
        prompts += json.loads(wmt.read_text())[WMT_HELD_OUT:]
    rng.shuffle(prompts)
    return prompts


def mt_bench_prompts(data_dir: Path) -> list[str]:
    path = data_dir / "mt_bench.jsonl"
    if not path.exists():
        raise ValueError(f"held-out prompt file {path} does not exist")
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]


def default_data_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "shared" / "data"
