"""The instruction stream for data at scale: an endless, deterministic sequence of distinct
instructions from offline sources (no network, no dev or demo prompts).

Boundary: text only, no model. `stream(seed)` yields {index, source, prompt}; for a given seed
and Python installation it always yields the same instructions in the same order, so a prefix
[0, n) never changes when more are taken (shards.py stores index ranges of it, append-only).
Sources (weights in SOURCES), each drawing from its own seeded generator:
- `chat`, `writing`, `lists`: pool.py's topic templates;
- `math`: word problems and exercises with seeded numbers;
- `code`: programming tasks from seeded (task, language, wording) combinations;
- `passage`: docstrings of installed modules and paragraphs of Python's pydoc topics, each
  with a task: summarize, answer, rewrite, extract JSON, list key points, title, explain.
Bump VERSION whenever the stream's output changes.
"""
from __future__ import annotations

import importlib
import inspect
import random
import warnings
from collections.abc import Iterator
from functools import lru_cache

from specviz.train.pool import CHAT, CODE_TASKS, LISTS, TOPICS, WRITING

VERSION = "1"
SOURCES = {"chat": 3, "writing": 2, "lists": 2, "math": 3, "code": 3, "passage": 5}

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


def math_task(rng: random.Random) -> str:
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    c, d = rng.randint(2, 40), rng.randint(2, 20)
    return rng.choice(MATH).format(
        a=a, b=b, b0=rng.randint(1, a - 1), c=c, d=d, e=rng.randint(50, 900), f=rng.randint(2, 30),
        c0=c * rng.randint(2, 12), d0=d * rng.randint(2, 12), pct=rng.choice([5, 10, 15, 20, 25,
                                                                              30, 40, 50, 75]),
        name=rng.choice(NAMES), thing=rng.choice(THINGS))


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


def passage_tasks(seed: int) -> Iterator[str]:
    """Every (passage, task) pair once, in a seeded order (task order interleaved so that each
    passage first appears with one task, then with a second, ...)."""
    ps = list(passages())
    rng = random.Random(seed * 7919 + 17)
    for round_ in range(len(PASSAGE_TASKS)):
        order = list(range(len(ps)))
        rng.shuffle(order)
        for i in order:
            name, text = ps[i]
            task = PASSAGE_TASKS[(i + round_) % len(PASSAGE_TASKS)]
            yield task.format(p=text, name=name.split(" ")[-1] if "topic" in name else name)


def stream(seed: int = 0) -> Iterator[dict]:
    """Distinct instructions {index, source, prompt} forever (until every source runs dry)."""
    pick = random.Random(seed)
    rngs = {s: random.Random(f"{seed}:{s}") for s in SOURCES}
    makers = {"chat": lambda r: topic_task(r, CHAT), "writing": lambda r: topic_task(r, WRITING),
              "lists": lambda r: topic_task(r, LISTS), "math": math_task, "code": code_task}
    passage_iter = passage_tasks(seed)
    names = [s for s, w in SOURCES.items() for _ in range(w)]
    seen: set[str] = set()
    misses = dict.fromkeys(SOURCES, 0)
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


def take(n: int, start: int = 0, seed: int = 0) -> list[dict]:
    """Instructions [start, start + n) of `stream(seed)`."""
    out = []
    for item in stream(seed):
        if item["index"] >= start + n:
            break
        if item["index"] >= start:
            out.append(item)
    return out
