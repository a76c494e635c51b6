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
    "I spent a week in {place}. Help me turn my notes into a lively travel diary entry about its food and people.",
    "Write a short story of about 200 words that begins in {place} and ends with a surprise.",
    "A parcel for one of our customers is a week late. Write them an apology that offers a fix.",
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


# Long, multi-constraint requests (session 5): MT-Bench's questions carry a persona or a format, an
# audience and two or three constraints, and a draft trained on one-line tasks agreed with the target
# on 0.52 of pool positions but 0.31 of MT-Bench's. These are composed from parts, one kind per
# MT-Bench category, none from its text (`contaminated` checks that).
FORMS = [
    "cover letter", "product review", "opinion column", "wedding toast", "short speech", "newsletter item",
    "press release", "diary entry", "letter to the editor", "restaurant review", "social media post",
    "fable", "limerick", "sonnet", "recipe introduction", "museum placard", "podcast intro script",
    "movie pitch", "thank-you note", "complaint letter", "fundraising appeal", "job advertisement",
    "book blurb", "FAQ section", "welcome message for new members", "motivational message", "short mystery story",
    "bedtime story", "scene for a stage play", "set of instructions",
]
SUBJECTS = [
    "a reusable water bottle that tracks how much you drink", "a neighbourhood cleanup day", "a lost cat named Pepper",
    "a key found inside a library book", "a bakery that only opens at night", "a town where it never stops raining",
    "a new bicycle lane", "a robot that learns to paint", "the first day at a new school", "a community orchestra",
    "a village that shares one car", "a smartwatch for hikers", "an old lighthouse turned into a hotel",
    "a chess tournament for grandparents", "a museum of forgotten inventions", "a summer job at a zoo",
    "a power cut during a family dinner", "a language exchange club", "a rooftop vegetable garden",
    "a detective who is afraid of the dark", "a train that runs once a year", "a folding electric scooter",
    "a school trip to a science museum", "a friendship between a fox and a crow", "a noise-cancelling pillow",
] + TOPICS[:20]
AUDIENCES = [
    "for teenagers", "for busy parents", "for retired engineers", "for first-year university students",
    "for a company newsletter", "for readers who know nothing about the subject", "for a local newspaper",
    "for young children", "for a team of software developers", "for tourists", "for a group of investors",
]
CONSTRAINTS = [
    "Keep it under 150 words.", "Use a warm, humorous tone.", "End with a clear call to action.",
    "Fill it with sensory details.", "Organise it under three headings.", "Avoid technical jargon.",
    "Finish with a question for the reader.", "Write it in the second person.", "Use at least one metaphor.",
    "Mention two concrete numbers.", "Open with a sentence that hooks the reader.",
    "Put the key facts in a bulleted list.", "Make every sentence short.", "Keep the tone formal and polite.",
    "Do not use the letter z.", "Make it rhyme.", "Give it a title.", "Use exactly four paragraphs.",
]
CHARACTERS = [
    "a seasoned sea captain", "a Renaissance painter", "a 1950s radio host", "a dragon who guards a library",
    "an ancient Greek philosopher", "a veteran firefighter", "a cheerful barista", "a strict ballet instructor",
    "a wise old owl", "a hard-boiled private eye", "an alien tourist visiting Earth", "a lighthouse keeper",
    "a medieval blacksmith", "a Mars colonist", "a retired spy", "a sports commentator", "a botanist",
    "a Shakespearean actor", "a tech support agent", "a nervous intern on the first day", "a famous chef",
    "a marine biologist", "a children's author", "a mountain guide", "a Roman emperor", "a robot butler",
    "a ghost who haunts a theatre", "a personal trainer", "a librarian", "a village doctor in 1900",
]
ROLE_OPENERS = [
    "Pretend you are {c}.", "Take on the role of {c} for the rest of this chat.",
    "You are {c}; stay in character and never mention being an AI.", "Play the part of {c}.",
    "Imagine you are {c}.", "From now on, answer as {c} would, with their voice and habits.",
    "Let's do a role-play: you are {c} and I am a curious visitor.",
]
ROLE_QUESTIONS = [
    "What is the hardest part of your work?", "Tell me about the best day of your life.",
    "What advice would you give me about {task}?", "How would you explain {concept} to a newcomer?",
    "What do you think of modern smartphones?", "Describe what you see around you right now.",
    "A visitor complains that they have waited an hour. How do you respond?",
    "What would you change about the world if you could?", "Tell me a story from your past that taught you something.",
    "I feel stuck and unmotivated this week. What should I do?", "What are you most proud of, and why?",
    "Convince me to try {hobby}.",
]
HOBBIES = ["rock climbing", "bread baking", "birdwatching", "knitting", "journaling", "sailing", "pottery", "chess"]
PROFESSIONS = [
    ("a dentist", "teeth and oral health", "Why do my gums bleed when I floss?"),
    ("a tax adviser", "personal finance", "Should I pay off my student loan early or invest?"),
    ("a dog trainer", "dog behaviour", "My puppy chews every shoe in the house. What can I do?"),
    ("a physics tutor", "physics", "Why does a spinning top not fall over?"),
    ("a gardener", "plants", "Why are the leaves of my tomato plants turning yellow?"),
    ("a career coach", "job searching", "How do I explain a two-year gap in my CV?"),
    ("a history teacher", "history", "Why did the Roman Empire split in two?"),
    ("a sleep specialist", "sleep", "Why do I wake up at 3 a.m. every night?"),
    ("a chemistry teacher", "chemistry", "Why does salt melt ice on the road?"),
    ("a software architect", "software design", "When should a small team split its app into services?"),
    ("a nutrition coach", "healthy eating", "Is it bad to eat late in the evening?"),
    ("an interior designer", "home decoration", "How can I make a small flat feel bigger?"),
]
ROLE_TASKS = [
    "You are {p}. I will ask you questions about {d}, and you will answer in plain language with one practical "
    "example. My first question: {q}",
    "Act as {p} giving a short consultation. Ask me one clarifying question, then give your best advice on "
    "this: {q}",
    "I'd like you to be {p}. Keep your answers under 120 words and avoid jargon. Here is my question: {q}",
]
SCIENCE = [
    "entropy", "natural selection", "plate tectonics", "the greenhouse effect", "Newton's third law", "half-life",
    "DNA replication", "the Doppler effect", "antibiotic resistance", "osmosis", "buoyancy", "static electricity",
    "refraction of light", "air pressure", "the conservation of energy", "friction", "evaporation",
]
FIELDS = [
    "biology", "economics", "physics", "psychology", "chemistry", "computer science", "astronomy", "geology",
    "sociology", "medicine", "ecology", "linguistics",
]
STEM_TEMPLATES = [
    "Explain {science} and its link with {concept2}. Give one example a student could check at home.",
    "From the point of view of {field}, what causes {topic}? Describe the mechanism step by step.",
    "Write a clear explanation of {concept} for {audience_plain}, then list three common mistakes people make "
    "about it.",
    "How do scientists measure things related to {topic}? Describe two methods and their limits.",
    "Describe an experiment that shows {science}. List the materials, the steps and what to expect.",
]
HUMANITIES_TEMPLATES = [
    "Discuss how {topic} changed everyday life. Give two arguments on each side and a short conclusion.",
    "Compare how two different countries have approached {topic}. Use concrete examples and end with a verdict.",
    "What can the history of {topic} teach us about {concept}? Answer in three paragraphs.",
    "Imagine a debate on {topic}. Write the opening statement for each side, then judge who argued better.",
    "Outline a five-lesson course on {topic} for adult learners, with one reading or activity per lesson.",
]
PASSAGES = [
    "Last Tuesday, {a} opened a small repair cafe on {street} Street. Volunteers fixed {n} toasters, {m} bikes and "
    "a grandfather clock. The cafe will open again on the first Saturday of next month, {a} said.",
    "The city council voted {n} to {m} to build a new library near the river. Council member {a} argued it would "
    "cost too much, while {b} said the old building is unsafe. Work starts in {year}.",
    "Review by {a}: The headphones sound great and the battery lasts about {n} hours, but they hurt my ears after "
    "an hour. Customer service, run by {b}, replaced a broken cable within {m} days.",
    "In {year}, researchers led by {a} found that bees in {place} visited {n} kinds of flowers, {m} more than "
    "expected. {b}, who was not involved, called the result surprising.",
]
EXTRACTION_TASKS = [
    "Read the text below and return a JSON object with the people, places, numbers and dates it mentions.\n\n{text}",
    "Summarise the following text in one sentence, then list every person named in it and their role.\n\n{text}",
    "Here is a short text:\n\n{text}\n\nIs its overall tone positive, negative or mixed? Quote the words that "
    "show it, as a bulleted list.",
    "Turn the facts in this passage into a table with the columns fact and value:\n\n{text}",
]
CODING_TASKS = [
    "parses a date written as DD/MM/YYYY and returns the day of the week",
    "counts how often each word appears in a text file and prints the ten most common",
    "checks whether two strings are anagrams", "finds the longest common prefix of a list of strings",
    "validates an email address without using regular expressions",
    "returns all pairs of numbers in a list that add up to a target", "rotates a square matrix by 90 degrees",
    "implements a simple stack with push, pop and peek", "converts a Roman numeral to an integer",
    "groups a list of people by their age decade", "computes a running median of a stream of numbers",
    "detects a cycle in a linked list", "merges overlapping intervals", "implements a least-recently-used cache",
    "computes the edit distance between two words", "checks whether brackets in a string are balanced",
]
CODING_EXTRAS = [
    "Add comments that explain each step.", "Handle invalid input gracefully.", "Do not use external libraries.",
    "Include two example calls with their output.", "State its time and space complexity.",
    "Then explain how you would test it.",
]
MATH_TEMPLATES = [
    "{a_name} saves {x} dollars a week and spends {y} dollars every fourth week. How much has {a_name} saved after "
    "{w} weeks? Show each step.",
    "A rectangle is {xl} cm long and its width is {y} cm less than its length. Find its area and its perimeter, "
    "and explain the formulas you use.",
    "Find all integer solutions of {x}x + {y}y = {z} with 0 <= x, y <= 20, and describe your method.",
    "A bag has {x} green and {y} yellow marbles. Two are drawn without replacement. What is the probability "
    "that both are green? Explain.",
    "What is the remainder when {x} to the power {w} is divided by 7? Explain without computing the whole number.",
    "A recipe for {w} people needs {x} grams of flour. How much flour is needed for {y} people, and how did you "
    "work it out?",
]
REASONING_TEMPLATES = [
    "{a}, {b} and {c} each own one pet: a cat, a dog or a parrot. {a} is allergic to fur and {b} does not own the "
    "dog. Who owns which pet? Explain each deduction.",
    "I have {x} socks of each of three colours in a drawer, in the dark. How many must I take out to be sure of a "
    "matching pair? Explain.",
    "{a} says: \"{b} is lying.\" {b} says: \"{c} is lying.\" {c} says: \"{a} and {b} are both lying.\" Who tells "
    "the truth? Reason it out.",
    "A clock shows 3:15. What is the angle between the hour and minute hands? Walk through your reasoning.",
    "If every {thing1} is a {thing2} and some {thing2}s are blue, must some {thing1}s be blue? Explain carefully.",
    "{a} is taller than {b} but shorter than {c}; {d} is shorter than {b}. Rank them from tallest to shortest and "
    "explain.",
]
THINGS = [("glorp", "blip"), ("tove", "wabe"), ("zink", "florb"), ("mome", "rath")]
STREETS = ["Maple", "Harbour", "Station", "Mill", "Orchard", "Church", "Bridge"]


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


def _long_prompts(rng: random.Random, n: int) -> list[str]:
    """`n` long requests, the eight kinds in turn (writing, roleplay x2, reasoning, math, coding,
    extraction, STEM, humanities)."""
    out = []
    for i in range(n):
        kind = i % 9
        a, b, c, d = rng.sample(NAMES, 4)
        x, y, w = rng.randint(3, 40), rng.randint(2, 30), rng.randint(3, 12)
        fill = dict(topic=rng.choice(TOPICS), concept=rng.choice(CONCEPTS), concept2=rng.choice(CONCEPTS),
                    field=rng.choice(FIELDS), task=rng.choice(TASKS), hobby=rng.choice(HOBBIES),
                    audience_plain=rng.choice(AUDIENCES)[4:], science=rng.choice(SCIENCE))
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
            passage = rng.choice(PASSAGES).format(a=a, b=b, n=x, m=y, year=rng.randint(1990, 2024),
                                                  street=rng.choice(STREETS), place=rng.choice(PLACES))
            text = rng.choice(EXTRACTION_TASKS).format(text=passage)
        elif kind == 7:
            text = rng.choice(STEM_TEMPLATES).format(**fill)
        else:
            text = rng.choice(HUMANITIES_TEMPLATES).format(**fill)
        out.append(text)
    return list(dict.fromkeys(out))


# Data-rich extraction (session 6): MT-Bench's extraction questions hand over several records or a long
# text and ask for fields, rankings or a format (JSON, CSV, one line each); the pool's one-passage tasks
# left extraction the weakest category (agreement 0.22). Records here are generated, so answers must copy
# names and numbers from the prompt, which is what the draft has to learn.
FIRMS = ["Northwind Foods", "Bluepeak Solar", "Harbor Logistics", "Quillon Books", "Vesta Robotics",
         "Greenleaf Pharmacy", "Copperline Telecom", "Aster Airlines", "Mosaic Games", "Tidewater Bank"]
SURNAMES = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Silva", "Kowalski", "Haddad", "Brennan", "Novak", "Reyes"]
TITLE_WORDS = (["Silent", "Crimson", "Last", "Hidden", "Paper", "Glass", "Winter", "Distant", "Broken", "Golden"],
               ["Harbour", "Orchard", "Letters", "Kingdom", "Lantern", "River", "Garden", "Clock", "Road", "Mirror"])
ITEMS = ["wireless earbuds", "laptop", "coffee machine", "hotel stay", "thriller film", "cookbook", "running shoes",
         "tablet", "Italian restaurant", "travel backpack"]
PRAISE = ["the build quality is excellent", "it was worth every penny", "the staff were friendly",
          "the battery easily lasts two days", "I would happily recommend it", "the story kept me guessing",
          "it is light and comfortable", "setup took five minutes"]
GRIPES = ["it stopped working after a month", "the price is far too high", "delivery took three weeks",
          "the ending was a let-down", "the app keeps crashing", "it is louder than advertised",
          "customer support never replied", "the instructions are confusing"]
RECORD_TASKS = [
    "Work out each firm's margin (its profit as a share of its revenue) and say which firm comes out on top. "
    "Show the calculation for each one.\n\n{text}",
    "Turn the records below into CSV with a header row (company, leader, revenue, profit, staff, year).\n\n{text}",
    "Return a JSON list with one object per company (name, leader, city, profit), sorted by profit, highest "
    "first.\n\n{text}",
    "Read the reports below. Which leader runs the company with the most staff, and how many more staff does it "
    "have than the smallest one?\n\n{text}",
]
REVIEW_TASKS = [
    "Give each review below a score from 1 (very negative) to 5 (very positive). Answer with a JSON array of "
    "integers in the same order.\n\n{text}",
    "For every review below, name the product and list what the writer liked and disliked, one line per "
    "review.\n\n{text}",
    "Read these customer reviews and say which complaint comes up most often. Quote the sentences that "
    "support your answer.\n\n{text}",
]
BOOK_TASKS = [
    "For each description below, give the title, the writer, the central character and the year, one line "
    "each, in the form title | writer | character | year.\n\n{text}",
    "List the works described below from the oldest to the newest as a JSON array of objects with the fields "
    "title, writer and year.\n\n{text}",
    "Which of the works below is set in {place}? Answer with its title and writer, then explain how you "
    "found it.\n\n{text}",
]
TABLE_TASKS = [
    "Here are daily sales records. For each month, give the day with the highest and the lowest revenue. "
    "Answer as CSV.\n\n{text}",
    "From the records below, compute the total units sold and the average revenue per day. Show your "
    "working.\n\n{text}",
    "Convert these records into a JSON array of objects, keeping every field.\n\n{text}",
]


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
                lines.append(f"{firm}, led by {rng.choice(NAMES)} {rng.choice(SURNAMES)} from {rng.choice(PLACES)}, "
                             f"reported revenue of ${revenue} million and a profit of ${rng.randint(1, revenue // 3)}"
                             f" million in {rng.randint(2015, 2024)}, with {rng.randint(40, 9000)} staff.")
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
                lines.append(f"In {title} ({rng.randint(1850, 2023)}), {rng.choice(NAMES)} {rng.choice(SURNAMES)} "
                             f"follows {rng.choice(NAMES)}, {rng.choice(CHARACTERS)}, through {place} "
                             f"in a story about {rng.choice(TOPICS)}.")
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
    from ..data import data_dir

    return data_dir()
