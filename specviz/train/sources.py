"""The instruction stream for data at scale: an endless, deterministic sequence of distinct
instructions from offline sources (no network, no dev or demo prompts).

Boundary: text only, no model. `stream(seed)` yields {index, source, prompt}; for a given seed
and Python installation it always yields the same instructions in the same order, so a prefix
[0, n) never changes when more are taken (shards.py stores index ranges of it, append-only).
Sources (weights in SOURCES[version]), each drawing from its own seeded generator:
- `chat`, `writing`, `lists`: pool.py's topic templates;
- `math`: word problems and exercises with seeded numbers;
- `code`: programming tasks from seeded (task, language, wording) combinations;
- `passage`: docstrings of installed modules and paragraphs of Python's pydoc topics, each
  with a task: summarize, answer, rewrite, extract JSON, list key points, title, explain.
Version 2 (templates.py) adds the kinds of request version 1 lacked: `translate`, `rewrite`
(tone), `reading` (questions on and summaries of short narrative paragraphs with seeded facts),
`code_read` (generated snippets and short standard-library functions to explain, test,
comment or translate), `howto` (habits, tips, why-questions, how devices work), `steps`
(multi-step word problems), `structured` (JSON, CSV, tables, lists), `story` and `message`;
it keeps the version-1 sources at lower weight, from other seeds, starts the passage tasks
after those version 1's shards used (PASSAGE_START) and skips every instruction of the prefix of
version 1 that its shards answered (PRIOR), so that no answer is generated twice.
Version 3 widens the vocabulary instead of the kinds of request: the drafters trained on versions
1-2 gained on held-out answers of those streams but not on unseen prompts, whose topics their
small topic lists never named. Its sources draw from lexicon.py's open vocabulary (about 12k
common nouns by kind, 2k verbs, 9k natural example sentences, from WordNet): `noun` (requests
about one word, worded by its kind), `pair` (comparing two words of a kind), `verb` (how-to and
usage) and `sentence` (translating, rewriting, explaining or continuing example sentences).
Version 4 crosses the two: version 3's shards traded code, math and rewriting for chat, because
its four sources are all about single words. It keeps version 2's kinds of request (code, reading
code, multi-step problems, reading, structured output, how-to, rewriting, passages) and fills
their slots from the lexicon: coding tasks about a concrete noun, snippets and word problems over
its nouns, records with fields by the noun's kind, activities from its verbs, tone rewrites of
its example sentences; a little of version 3's `noun` and `sentence` keeps the writing requests.
It skips what the shards of versions 2 and 3 answered (PRIOR).
Every version stays reproducible (committed shards name theirs); a new one gets a new VERSION.
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import random
import re
import warnings
from collections.abc import Iterator, Sequence
from functools import lru_cache

from specviz.train import lexicon
from specviz.train import templates as tp
from specviz.train.pool import CHAT, CODE_TASKS, LISTS, TOPICS, WRITING

VERSION = "4"                    # the stream new shards answer
SOURCES = {
    "1": {"chat": 3, "writing": 2, "lists": 2, "math": 3, "code": 3, "passage": 5},
    "2": {"chat": 2, "writing": 1, "lists": 1, "math": 1, "code": 3, "passage": 2, "howto": 3,
          "steps": 3, "code_read": 3, "reading": 4, "translate": 2, "rewrite": 2,
          "structured": 2, "story": 2, "message": 2},
    "3": {"noun": 6, "pair": 1, "verb": 2, "sentence": 4},
    "4": {"code": 4, "code_read": 3, "steps": 3, "math": 1, "reading": 4, "structured": 4,
          "howto": 2, "rewrite": 3, "passage": 3, "noun": 2, "sentence": 1},
}
# passage tasks: version 1's shards 1-38 used [0, 3029), version 2's shards 39-109 [4000, 5665)
PASSAGE_START = {"1": 0, "2": 4000, "3": 0, "4": 6000}
# ((version, n), ...): the first n instructions of that version that committed shards answered
PRIOR = {"2": (("1", 9120),), "4": (("2", 17040), ("3", 10080))}

PASSAGE_MODULES = [
    "string", "os", "os.path", "json", "re", "collections", "itertools", "functools", "math",
    "random", "statistics", "textwrap", "datetime", "pathlib", "heapq", "bisect", "shutil",
    "csv", "fractions", "decimal", "copy", "enum", "operator", "difflib", "calendar", "base64",
    "hashlib", "zipfile", "tarfile", "glob", "fnmatch", "struct", "uuid", "argparse", "logging",
    "typing", "dataclasses", "contextlib", "asyncio", "threading", "subprocess", "socket",
    "urllib.parse", "http.client", "email.message", "html", "xml.etree.ElementTree", "sqlite3",
    "unittest", "inspect", "ast", "tokenize", "pickle", "io", "time", "secrets", "queue",
    "array", "weakref", "abc", "numbers", "cmath", "locale", "gettext", "pprint", "reprlib",
    "graphlib", "zlib", "gzip", "configparser", "tempfile", "filecmp", "shlex", "selectors",
    "numpy", "numpy.linalg", "numpy.random",
]
PASSAGE_TASKS = [
    "Summarize the following text in one or two sentences:\n\n{p}",
    "Read this documentation and explain in simple words what `{name}` does:\n\n{p}",
    "Rewrite the following text in plain, friendly English:\n\n{p}",
    "Extract a JSON object with the keys \"name\", \"purpose\" and \"mentions\" (a list of the "
    "functions, types or options mentioned) from this text:\n\n{p}",
    "List the key points of this text as bullet points:\n\n{p}",
    "{p}\n\nWhat is the main idea of this passage?",
    "Suggest a short title for this passage, then justify it in one sentence:\n\n{p}",
    "Write one question a student might ask about this text, and answer it:\n\n{p}",
    "Explain this to a beginner programmer, with a small example:\n\n{p}",
    "Rewrite this text as a short, formal paragraph:\n\n{p}",
]

MATH = [
    "What is {a} + {b}?", "What is {a} - {b}?", "What is {c} times {d}?", "What is {a} times {c}?",
    "What is {e} divided by {c}? Give the remainder too.",
    "If I have {a} {thing}s and give away {b0}, how many are left?",
    "{name} has {c} boxes with {d} {thing}s in each. How many {thing}s are there in total?",
    "A train travels at {c}0 km per hour for {d} hours. How far does it go?",
    "What is {pct} percent of {a}?", "Solve for x: {c}x + {d} = {e}.",
    "Solve for x: {c}x - {d} = {e}.", "A rectangle is {c} cm wide and {d} cm long. What are "
    "its area and its perimeter?", "What is the square of {c}? And its cube?",
    "Is {a} a prime number? Explain.", "What is the average of {c}, {d}, {a} and {b}?",
    "Convert {e} minutes into hours and minutes.", "Simplify the fraction {c0}/{d0}.",
    "{name} reads {d} pages a day. How many days does a {e}-page book take?",
    "A shirt costs ${a}. It is on sale for {pct}% off. What is the sale price?",
    "What is the greatest common divisor of {c0} and {d0}?",
    "What is the least common multiple of {c} and {d}?",
    "A car uses {d} liters of fuel per 100 km. How much fuel does it need for {e} km?",
    "{name} saves ${c} every week. How much is saved after {d} weeks, and after a year?",
    "The sides of a triangle are {c}, {d} and {f} cm. What is its perimeter? Can such a "
    "triangle exist?", "Write {a} in binary.", "What is {c}% of {e}, and what is {e}% of {c}?",
    "A recipe for {d} people needs {c}00 g of flour. How much flour is needed for {f} people?",
    "Round {a}.{d}{c} to one decimal place.", "Is {a} divisible by {d}? Show why.",
    "Explain step by step how to compute {c} x {b}.",
]
NAMES = ["Tom", "Maria", "Aisha", "Ken", "Lucia", "Omar", "Priya", "Jonas", "Mei", "Sam"]
THINGS = ["apple", "pencil", "marble", "book", "cookie", "sticker", "coin", "card", "egg", "toy"]

CODE_VERBS = [
    "Write a {lang} function that {task}.", "Write a {lang} function that {task}. Include a "
    "docstring and one example.", "Show a short {lang} example that {task}.",
    "How would you write {lang} code that {task}? Explain your approach.",
    "Write a unit test for a {lang} function that {task}.",
    "Write a {lang} function that {task}, and give its time complexity.",
    "Fix the bugs a beginner might make when writing a {lang} function that {task}.",
    "Write a {lang} class with a method that {task}.",
]
LANGS = ["Python", "Python", "Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go",
         "Rust", "Bash", "SQL"]
CODE_PARAM_TASKS = [
    "returns the first {n} prime numbers", "sums the multiples of {k} below {m}",
    "splits a list into chunks of size {k}", "rotates a list by {k} positions",
    "returns the {n} most common words in a text", "pads a string to {m} characters",
    "checks whether a number is divisible by {k} and by {j}", "prints a {n} x {n} multiplication "
    "table", "returns every {k}-th element of a list", "generates {n} random numbers between 1 "
    "and {m}", "counts the numbers below {m} whose digits sum to {k}",
    "truncates a string to {m} characters and adds an ellipsis", "retries a function up to {n} "
    "times", "computes the moving average of a list with a window of {k}",
    "formats a number with {k} decimal places", "returns the {n}-th triangular number",
]


@lru_cache(maxsize=2)
def passages() -> tuple[tuple[str, str], ...]:
    """(name, text): docstrings (150-900 characters) of the public functions, classes and
    methods of PASSAGE_MODULES, and pydoc topic paragraphs; sorted, duplicates dropped."""
    out: dict[str, str] = {}

    def add(name: str, doc: str | None) -> None:
        doc = (doc or "").strip()
        if 150 <= len(doc) <= 900 and doc[0].isalpha() and doc not in out.values():
            out.setdefault(name, doc)

    for modname in PASSAGE_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        with warnings.catch_warnings():              # e.g. typing.io's deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            for name, doc in module_docs(modname, mod):
                add(name, doc)
    from pydoc_data.topics import topics
    for key in sorted(topics):
        for j, para in enumerate(topics[key].split("\n\n")):
            add(f"the Python topic '{key}' (part {j + 1})", " ".join(para.split()))
    return tuple(sorted(out.items()))


def module_docs(modname: str, mod) -> list[tuple[str, str | None]]:
    """(qualified name, docstring) of a module's public functions and classes, and of the
    public methods of the classes it defines."""
    out = []
    for attr in sorted(dir(mod)):
        obj = getattr(mod, attr, None)
        if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)
                                        or inspect.isbuiltin(obj)):
            continue
        out.append((f"{modname}.{attr}", inspect.getdoc(obj)))
        if inspect.isclass(obj) and obj.__module__.startswith(modname.split(".")[0]):
            out += [(f"{modname}.{attr}.{m}", inspect.getdoc(f))
                    for m, f in sorted(vars(obj).items()) if not m.startswith("_") and callable(f)]
    return out


def math_task(rng: random.Random, things: Sequence[str] = THINGS) -> str:
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    c, d = rng.randint(2, 40), rng.randint(2, 20)
    return rng.choice(MATH).format(
        a=a, b=b, b0=rng.randint(1, a - 1), c=c, d=d, e=rng.randint(50, 900), f=rng.randint(2, 30),
        c0=c * rng.randint(2, 12), d0=d * rng.randint(2, 12), pct=rng.choice([5, 10, 15, 20, 25,
                                                                              30, 40, 50, 75]),
        name=rng.choice(NAMES), thing=rng.choice(things))


def code_task(rng: random.Random) -> str:
    if rng.random() < 0.5:
        task = rng.choice(CODE_TASKS)
    else:
        task = rng.choice(CODE_PARAM_TASKS).format(n=rng.randint(3, 20), k=rng.randint(2, 9),
                                                   j=rng.randint(2, 9), m=rng.randint(20, 500))
    return rng.choice(CODE_VERBS).format(lang=rng.choice(LANGS), task=task)


def topic_task(rng: random.Random, templates: list[str]) -> str:
    t, u = rng.sample(TOPICS, 2)
    return rng.choice(templates).format(t=t, u=u)


def passage_tasks(seed: int, start: int = 0) -> Iterator[str]:
    """Every (passage, task) pair once, in a seeded order (task order interleaved so that each
    passage first appears with one task, then with a second, ...), from the start-th on."""
    ps = list(passages())
    rng = random.Random(seed * 7919 + 17)

    def pairs() -> Iterator[tuple[int, int]]:
        for round_ in range(len(PASSAGE_TASKS)):
            order = list(range(len(ps)))
            rng.shuffle(order)
            yield from ((round_, i) for i in order)

    for round_, i in itertools.islice(pairs(), start, None):
        name, text = ps[i]
        task = PASSAGE_TASKS[(i + round_) % len(PASSAGE_TASKS)]
        yield task.format(p=text, name=name.split(" ")[-1] if "topic" in name else name)


def fill(rng: random.Random, template: str, vocab: dict[str, list[str]]) -> str:
    """template with each {key} of vocab replaced by a seeded choice (other keys left as is)."""
    return re.sub(r"\{(\w+)\}", lambda m: rng.choice(vocab[m.group(1)])
                  if m.group(1) in vocab else m.group(0), template)


def translate_task(rng: random.Random) -> str:
    s = fill(rng, rng.choice(tp.SENTENCES), tp.FILL | {"city": tp.CITIES,
                                                      "n": [str(n) for n in range(2, 12)]})
    return rng.choice(tp.TRANSLATE).format(lang=rng.choice(tp.LANGUAGES), s=s)


def rewrite_task(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(tp.REWRITE).format(m=fill(rng, rng.choice(tp.INFORMAL), tp.TONE))
    return rng.choice(tp.REWRITE_FORMAL).format(m=fill(rng, rng.choice(tp.FORMAL), tp.TONE))


def paragraph(rng: random.Random, items: Sequence[tuple[str, int, int]] = tp.ITEMS
              ) -> tuple[str, list[str]]:
    """A short narrative paragraph with seeded facts, and questions its text answers; a shopping
    paragraph buys (item, lowest price, highest price) of `items`."""
    name, name2 = rng.sample(tp.NAMES, 2)
    kind = rng.randrange(4)
    if kind == 0:
        (i1, lo1, hi1), (i2, lo2, hi2), (i3, lo3, hi3) = rng.sample(items, 3)
        n1, n2 = rng.randint(2, 6), rng.randint(2, 5)
        p1, p2, p3 = rng.randint(lo1, hi1), rng.randint(lo2, hi2), rng.randint(lo3, hi3)
        text = (f"{name} bought {n1} {i1}s, {n2} {i2}s and one {i3} for "
                f"{rng.choice(tp.OCCASIONS)}. Each {i1} cost ${p1}, each {i2} cost ${p2}, and "
                f"the {i3} cost ${p3}. {name} paid with {rng.choice(['cash', 'a card'])}.")
        qs = [f"How much did {name} spend in total?", f"How many items did {name} buy?",
              "Which single item was the most expensive?", f"How much did the {i1}s cost "
              "altogether?"]
    elif kind == 1:
        town = rng.choice(["Aldmoor", "Bracken Bay", "Castellon", "Dunmere", "Elverton",
                           "Fairhaven", "Glenwick", "Holloway", "Kestrel Point", "Larkfield"])
        f1, f2 = rng.sample(tp.FEATURES, 2)
        season, fest = rng.choice(tp.SEASONS), rng.choice(tp.FESTIVALS)
        year, pop = rng.randint(1150, 1950), rng.randint(2, 90) * 100
        text = (f"{town} is a {rng.choice(tp.PLACE_KINDS)} in {rng.choice(tp.REGIONS)}. It was "
                f"founded in {year} and has about {pop} residents. It is known for its {f1} and "
                f"its {f2}. Every {season}, {fest} attracts visitors from all over the region.")
        qs = [f"When was {town} founded?", f"What is {town} known for?",
              f"What happens in {town} every {season}?", f"About how many people live in {town}?"]
    elif kind == 2:
        org, event, cause = rng.choice(tp.ORGS), rng.choice(tp.EVENTS), rng.choice(tp.CAUSES)
        n, money = rng.randint(20, 400), rng.randint(3, 90) * 50
        month = rng.choice(["January", "March", "May", "July", "September", "November"])
        text = (f"Last {month}, the {org} of {rng.choice(tp.CITIES)} organized a {event}. "
                f"{n} people took part, and together they raised ${money} for {cause}. "
                f"{name}, who led the team, said the day went better than expected. Next year "
                f"the organizers plan to {rng.choice(tp.PLANS)}.")
        qs = ["How much money was raised, and for what?", "How many people took part?",
              "What do the organizers plan for next year?", f"Who is {name}?"]
    else:
        job, way = rng.choice(tp.JOBS), rng.choice(tp.TRANSPORT)
        h1, minutes = rng.randint(5, 8), rng.randint(10, 55)
        text = (f"{name} works as a {job} in {rng.choice(tp.CITIES)}. Every morning {name} gets up "
                f"at {h1} o'clock and takes the {way} to work, a trip of {minutes} minutes. After "
                f"work, {name} often meets {name2} to {rng.choice(tp.FILL['hobby'])}. On "
                f"weekends they visit "
                f"{rng.choice(['the market', 'the coast', 'family', 'a museum'])}.")
        qs = [f"What is {name}'s job?", f"How does {name} get to work, and how long does it take?",
              f"What time does {name} get up?", f"What does {name} do after work?"]
    return text, qs


def reading_task(rng: random.Random, items: Sequence[tuple[str, int, int]] = tp.ITEMS) -> str:
    text, qs = paragraph(rng, items)
    if rng.random() < 0.55:
        return rng.choice(tp.READ_TASKS).format(p=text, q=rng.choice(qs))
    return rng.choice(tp.SUMMARY_TASKS).format(p=text, k=rng.choice(["two", "three"]))


def snippet(rng: random.Random, words: Sequence[str] = tp.WORDS) -> str:
    """A small generated Python program with seeded values and words."""
    nums = [rng.randint(-9, 40) for _ in range(rng.randint(3, 7))]
    a, b, k = rng.randint(1, 10), rng.randint(11, 60), rng.randint(2, 7)
    word = rng.choice(words)
    return rng.choice([
        f"nums = {nums}\nprint(sorted(nums)[len(nums) // 2], min(nums) + max(nums))",
        f"total = 0\nfor i in range({a}, {b}):\n    if i % {k} == 0:\n        total += i\n"
        "print(total)",
        f"text = \"the cat and the dog and the {word}\"\ncounts = {{}}\nfor w in text.split():\n"
        "    counts[w] = counts.get(w, 0) + 1\nprint(counts)",
        f"s = \"{word}\"\nprint(s[::-1].upper(), s == s[::-1])",
        f"squares = [x * x for x in range({b % 12 + 3}) if x % 2 == {k % 2}]\nprint(squares)",
        f"def f(a, b):\n    return a * b + {k}\n\nprint(f({a}, {k}), f({k}, {a}))",
        f"n = {a + 5}\nsteps = 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
        "    steps += 1\nprint(steps)",
        f"data = {nums}\nevens = list(filter(lambda x: x % 2 == 0, data))\nprint(sum(evens) / "
        "max(len(evens), 1))",
        f"words = [\"{word}\", \"sky\", \"apple\", \"tree\"]\nprint(sorted(words, key=len))",
        f"x = {nums[0]}\nif x > {k}:\n    print(\"big\")\nelif x == {k}:\n    print(\"equal\")\n"
        "else:\n    print(\"small\")",
        f"matrix = [[{a}, {k}], [{b}, {nums[-1]}]]\nprint([list(r) for r in zip(*matrix)])",
        f"def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in \"aeiou\")\n\n"
        f"print(count_vowels(\"{word.title()} and {rng.choice(words)}\"))",
    ])


@lru_cache(maxsize=2)
def short_functions() -> tuple[str, ...]:
    """The sources (4-16 lines, at most 700 characters) of the pure-Python functions of
    PASSAGE_MODULES, sorted, duplicates dropped."""
    out = set()
    for modname in PASSAGE_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            if attr.startswith("_") or not inspect.isfunction(obj):
                continue
            try:
                src = inspect.getsource(obj)
            except (OSError, TypeError):
                continue
            if 4 <= src.count("\n") <= 16 and len(src) <= 700 and src.startswith("def "):
                out.add(src.rstrip())
    return tuple(sorted(out))


def code_read_task(rng: random.Random, words: Sequence[str] = tp.WORDS) -> str:
    if rng.random() < 0.6:
        return rng.choice(tp.CODE_READ_TASKS).format(c=snippet(rng, words))
    return rng.choice(tp.FUNCTION_TASKS).format(c=rng.choice(short_functions()))


def howto_task(rng: random.Random, activities: Sequence[str] = tp.ACTIVITIES,
               devices: Sequence[str] = tp.DEVICES) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(tp.ACTIVITY_TASKS).format(n=rng.choice(["three", "four", "five"]),
                                                    a=rng.choice(activities))
    if r < 0.75:
        return rng.choice(tp.WHY_TASKS).format(p=rng.choice(tp.PHENOMENA))
    return rng.choice(tp.DEVICE_TASKS).format(d=rng.choice(devices))


def steps_task(rng: random.Random, items: Sequence[tuple[str, int, int]] = tp.ITEMS) -> str:
    mover, lo, hi = rng.choice(tp.MOVERS)
    (item1, _, hi1), (item2, _, hi2) = rng.sample(items, 2)
    name, name2 = rng.sample(tp.NAMES, 2)
    n1, n2, p1, p2 = rng.randint(2, 6), rng.randint(2, 5), rng.randint(2, hi1), rng.randint(1, hi2)
    text = rng.choice(tp.WORD_PROBLEMS).format(
        mover=mover, s1=rng.randint(lo, hi), s2=rng.randint(lo, hi), t1=rng.randint(2, 6),
        t2=rng.randint(1, 4), name=name, name2=name2, n1=n1, n2=n2, item1=item1, item2=item2,
        p1=p1, p2=p2, bill=(n1 * p1 + n2 * p2) // 10 * 10 + rng.choice([10, 20, 50]),
        a=rng.randint(20, 500), pct=rng.choice([10, 15, 20, 25, 30, 40]),
        pct2=rng.choice([5, 10, 20, 25]), age=rng.randint(4, 15), k=rng.randint(2, 4),
        s3=rng.randint(50, 100), avg=rng.randint(60, 90), w=rng.randint(4, 20),
        l=rng.randint(6, 30))
    return f"{text} {rng.choice(tp.STEP_SUFFIXES)}".strip()


ENTITIES = tuple(sorted(tp.ENTITY_KEYS.items()))


def structured_task(rng: random.Random, categories: Sequence[str] = tp.CATEGORIES,
                    entities: Sequence[tuple[str, list[str]]] = ENTITIES) -> str:
    n = rng.choice(["three", "four", "five", "six"])
    if rng.random() < 0.5:
        return rng.choice(tp.LIST_TASKS).format(n=n, c=rng.choice(categories))
    entity, fields = rng.choice(entities)
    keys = rng.sample(fields, rng.randint(3, 5))
    return rng.choice(tp.STRUCT_TASKS).format(e=entity, n=n, keys=", ".join(keys))


def story_task(rng: random.Random) -> str:
    return rng.choice(tp.STORY_TASKS).format(n=rng.choice(["four", "five", "six"]),
                                             c=rng.choice(tp.CHARACTERS), p=rng.choice(tp.PLOTS))


def message_task(rng: random.Random) -> str:
    return rng.choice(tp.MESSAGE_TASKS).format(r=rng.choice(tp.RECIPIENTS),
                                               p=rng.choice(tp.PURPOSES))


# lexicon.py's noun kinds that take abstract wordings (the others are things one can describe)
ABSTRACT = {"act", "attribute", "cognition", "communication", "feeling", "group", "possession",
            "state", "time"}


def with_article(word: str) -> str:
    return f"{'an' if word[0].lower() in 'aeiou' else 'a'} {word}"


def noun_task(rng: random.Random) -> str:
    nouns = lexicon.load()["noun"]
    kind = rng.choice([k for k in sorted(nouns) for _ in range(1 if k in ABSTRACT else 2)])
    x = rng.choice(nouns[kind])
    own = tp.ABSTRACT_TASKS if kind in ABSTRACT else tp.NOUN_KIND_TASKS.get(kind, tp.NOUN_TASKS)
    return rng.choice(tp.NOUN_TASKS if rng.random() < 0.5 else own).format(
        x=x, a=with_article(x), p=rng.choice(tp.PLOTS))


def pair_task(rng: random.Random) -> str:
    nouns = lexicon.load()["noun"]
    x, y = rng.sample(nouns[rng.choice(sorted(nouns))], 2)
    return rng.choice(tp.PAIR_TASKS).format(x=x, y=y, a=with_article(x), b=with_article(y))


def verb_task(rng: random.Random) -> str:
    verbs = lexicon.load()["verb"]
    return rng.choice(tp.VERB_TASKS).format(v=rng.choice(verbs[rng.choice(sorted(verbs))]))


def sentence_task(rng: random.Random) -> str:
    examples = lexicon.load()["example"][""]
    if rng.random() < 0.8:
        return rng.choice(tp.SENTENCE_TASKS).format(s=rng.choice(examples),
                                                    lang=rng.choice(tp.LANGUAGES))
    return rng.choice(tp.SENTENCES_TASKS).format(ss="\n".join(rng.sample(examples, 3)))


# version 4: lexicon.py's nouns of the concrete kinds, by the fields of their structured records
CONCRETE = tuple(sorted(tp.KIND_KEYS))
CODED = ("animal", "artifact", "food", "object", "plant", "substance")   # the coding tasks' kinds


def plural_safe(word: str) -> bool:
    """Whether version 2's templates, which write "a {word}" and "{word}s", spell it right: one
    word, starting with a consonant, not ending in -s, -x, -z, -ch, -sh or -y."""
    return (" " not in word and word[0] not in "aeiou"
            and not word.endswith(("s", "x", "z", "ch", "sh", "y")))


@lru_cache(maxsize=1)
def wide() -> dict[str, tuple]:
    """Version 4's vocabularies for version 2's makers, from the lexicon: (kind, noun) pairs
    for the coding tasks, snippet words, shop items with a price range, activities, devices,
    list categories and structured-record entities."""
    lex = lexicon.load()
    nouns = [(k, x) for k in CONCRETE for x in lex["noun"][k]]
    things = [x for k, x in nouns if k in ("artifact", "food", "object", "plant")
              and plural_safe(x)]
    return {"coded": tuple((k, x) for k, x in nouns if k in CODED),
            "words": tuple(x for _, x in nouns if " " not in x), "things": tuple(things),
            "items": tuple((x, 2, 40) for x in things),
            "activities": tuple(f"learning to {v}" for k in sorted(lex["verb"])
                                for v in lex["verb"][k]),
            "devices": tuple(x for x in lex["noun"]["artifact"] if " " not in x),
            "categories": tuple(form.format(x=x, a=with_article(x)) for _, x in nouns
                                for form in tp.CATEGORY_FORMS),
            "entities": tuple((x, tp.KIND_KEYS[k]) for k, x in nouns if plural_safe(x))}


def code_noun_task(rng: random.Random) -> str:
    _, x = rng.choice(wide()["coded"])
    task = rng.choice(tp.CODE_NOUN_TASKS).format(x=x, a=with_article(x),
                                                 ident=x.replace(" ", "_"),
                                                 k=rng.randint(2, 9), n=rng.randint(3, 30))
    return rng.choice(CODE_VERBS).format(lang=rng.choice(LANGS), task=task)


def rewrite_sentence_task(rng: random.Random) -> str:
    return rng.choice(tp.REWRITE_FORMAL).format(m=rng.choice(lexicon.load()["example"][""]))


MAKERS = {"chat": lambda r: topic_task(r, CHAT), "writing": lambda r: topic_task(r, WRITING),
          "lists": lambda r: topic_task(r, LISTS), "math": math_task, "code": code_task,
          "translate": translate_task, "rewrite": rewrite_task, "reading": reading_task,
          "code_read": code_read_task, "howto": howto_task, "steps": steps_task,
          "structured": structured_task, "story": story_task, "message": message_task,
          "noun": noun_task, "pair": pair_task, "verb": verb_task, "sentence": sentence_task}
# the makers a version replaces (a version's sources keep their names across versions)
OVERRIDES = {"4": {
    "code": code_noun_task, "rewrite": rewrite_sentence_task,
    "math": lambda r: math_task(r, wide()["things"]),
    "code_read": lambda r: code_read_task(r, wide()["words"]),
    "steps": lambda r: steps_task(r, wide()["items"]),
    "reading": lambda r: reading_task(r, wide()["items"]),
    "structured": lambda r: structured_task(r, wide()["categories"], wide()["entities"]),
    "howto": lambda r: howto_task(r, wide()["activities"], wide()["devices"])}}


def stream(seed: int = 0, version: str = VERSION) -> Iterator[dict]:
    """Distinct instructions {index, source, prompt} forever (until every source runs dry)."""
    weights = SOURCES[version]
    tag = "" if version == "1" else f":v{version}"
    pick = random.Random(seed if version == "1" else f"{seed}{tag}")
    rngs = {s: random.Random(f"{seed}:{s}{tag}") for s in weights}
    makers = MAKERS | OVERRIDES.get(version, {})
    passage_iter = passage_tasks(seed, PASSAGE_START[version])
    names = [s for s, w in weights.items() for _ in range(w)]
    seen = set(answered_before(seed, version))
    misses = dict.fromkeys(weights, 0)
    index = 0
    while any(m < 1000 for m in misses.values()):
        src = pick.choice(names)
        if misses[src] >= 1000:          # a source that keeps repeating itself is dry
            continue
        text = next(passage_iter, None) if src == "passage" else makers[src](rngs[src])
        if text is None or text in seen:
            misses[src] += 1 if text is not None else 1000
            continue
        misses[src] = 0
        seen.add(text)
        yield {"index": index, "source": src, "prompt": text}
        index += 1


@lru_cache(maxsize=4)
def answered_before(seed: int, version: str) -> frozenset[str]:
    """The instructions of PRIOR[version] (earlier versions' answered prefixes) that `version`
    skips; computed once per process, not on every `stream` call."""
    return frozenset(x["prompt"] for v, n in PRIOR.get(version, ()) for x in take(n, 0, seed, v))


def take(n: int, start: int = 0, seed: int = 0, version: str = VERSION) -> list[dict]:
    """Instructions [start, start + n) of `stream(seed, version)`."""
    return list(itertools.islice(stream(seed, version), start, start + n))
