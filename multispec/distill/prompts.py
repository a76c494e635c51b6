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

# Chat-like requests in the manner of MT-Bench's categories (longer, multi-part, with a persona or a
# format to follow): the first pool was mostly one-line tasks and a draft trained on it transferred
# poorly to MT-Bench (greedy agreement 0.38 on the pool vs 0.21 on MT-Bench).
PLACES = [
    "Kyoto", "Lisbon", "Iceland", "Morocco", "Patagonia", "New Zealand", "Vienna", "Peru", "Vietnam",
    "the Scottish Highlands", "Cape Town", "Istanbul", "Banff National Park", "Sicily", "Seoul", "Mexico City",
]
PERSONAS = [
    "a pirate captain", "a medieval knight", "Sherlock Holmes", "a friendly robot", "a grumpy chef",
    "a Victorian-era scientist", "an astronaut on the International Space Station", "a fitness coach",
    "a travel agent", "a career counsellor", "a museum curator", "a detective in 1920s Chicago",
    "a stand-up comedian", "a kindergarten teacher", "a startup founder pitching to investors",
    "a nutritionist", "a park ranger", "a financial advisor", "a poet laureate", "a time traveller from 2300",
]
CONCEPTS = [
    "entropy", "natural selection", "compound interest", "the placebo effect", "opportunity cost",
    "plate tectonics", "the greenhouse effect", "Newton's third law", "DNA replication", "inflation targeting",
    "the separation of powers", "utilitarianism", "supply chains", "the Doppler effect", "neural networks",
    "public key cryptography", "the scientific method", "game theory", "the Industrial Revolution",
    "cognitive dissonance", "antibiotic resistance", "the water footprint of food", "existentialism",
    "the Cold War", "photosynthesis and respiration", "the law of diminishing returns", "half-life",
    "the social contract", "impressionist painting", "confirmation bias", "gerrymandering", "recursion",
]
PAIRS = [
    ("cats", "dogs as pets"), ("renting", "buying a home"), ("Python", "JavaScript for beginners"),
    ("electric cars", "hybrid cars"), ("e-books", "printed books"), ("working from home", "working in an office"),
    ("nuclear power", "solar power"), ("public schools", "private schools"), ("trains", "planes for travel in Europe"),
    ("capitalism", "socialism"), ("running", "swimming for fitness"), ("SQL", "NoSQL databases"),
]
TASKS = [
    "a job interview", "a first marathon", "a move to a new city", "a wedding speech", "a difficult conversation with a manager",
    "a science fair project", "a small garden", "a budget for a student", "a weekly meal plan", "a book club",
    "a team offsite", "a podcast launch", "a charity bake sale", "a road trip with children",
]
CHAT_TEMPLATES = [
    "Compose an engaging travel blog post about a recent trip to {place}, with cultural experiences and must-see sights.",
    "Write a short story of about 200 words that begins in {place} and ends with a surprise.",
    "Draft a professional email to a client apologising for a delayed delivery and proposing a solution.",
    "Act as {persona}. Introduce yourself and describe a typical day.",
    "Pretend to be {persona} and give advice to someone preparing for {task}.",
    "You are {persona}. Explain {concept} in your own voice.",
    "Explain {concept} in simple terms and give an everyday example.",
    "Describe {concept} and discuss why it matters today. Use at most three paragraphs.",
    "What is {concept}? Give a definition, an example, and a common misunderstanding.",
    "Compare {a} and {b}. Present the differences as a list and end with a recommendation.",
    "Help me plan {task}. Give me a step-by-step checklist.",
    "What are some tips for {task}? Explain why each one helps.",
    "Write a persuasive speech about {concept} for a school assembly.",
    "Give a balanced argument for and against {a} compared with {b}.",
    "Write a catchy headline and a two-paragraph introduction for an article about {concept}.",
    "Discuss the causes and consequences of {concept}, with one historical example.",
    "Rewrite this sentence to be more formal and explain your changes: \"hey, we gotta fix {concept} stuff asap.\"",
    "Create a lesson plan for a one-hour class on {concept} for high school students.",
    "Suggest five creative names for a cafe in {place} and explain each name.",
    "Write a product description for a travel guide to {place}, in a lively and persuasive tone.",
]


def _chat_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a, b = rng.choice(PAIRS)
        out.append(rng.choice(CHAT_TEMPLATES).format(place=rng.choice(PLACES), persona=rng.choice(PERSONAS),
                                                     concept=rng.choice(CONCEPTS), task=rng.choice(TASKS), a=a, b=b))
    return list(dict.fromkeys(out))  # drop repeats, keep the order


def _reasoning_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        x, y, z = rng.sample(NAMES, 3)
        a, b, c = rng.randint(3, 30), rng.randint(3, 30), rng.randint(2, 9)
        out.append(rng.choice([
            f"{x} is older than {y}, and {y} is older than {z}. Who is the youngest? Explain your reasoning.",
            f"A box holds {a} red and {b} blue balls. If I draw one ball at random, what is the probability it is "
            "blue? Show your work.",
            f"{x} has {a} apples and gives {c} to {y}, who then has twice as many as {z}. {z} has {b} apples. How many "
            f"apples did {y} have at the start? Think step by step.",
            f"If it takes {c} machines {c} minutes to make {c} widgets, how long would {a} machines take to make {a} "
            "widgets? Explain.",
            f"There are {a} people in a room and each shakes hands with every other person once. How many handshakes "
            "are there? Explain.",
            f"A shop raises a price by {a}% and then lowers it by {a}%. Is the final price the same as the original? "
            "Explain with an example.",
            f"{x} walks {a} km north, then {b} km east. How far is {x} from the start in a straight line?",
            f"The average of {c} numbers is {a}. One number, {b}, is removed. What is the average of the rest?",
        ]))
    return list(dict.fromkeys(out))


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
    prompts += _chat_prompts(rng, 2400) + _reasoning_prompts(rng, 400)
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
