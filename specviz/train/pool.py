"""The instruction templates and topics that sources.py draws from, and the meta-prompts with
which the target writes further instructions itself (self-instruct, `data.self_instructions`).

Boundary: text only, no model, no dev or demo prompts.
"""
from __future__ import annotations

import re

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "volcanoes",
    "machine learning", "the immune system", "climate change", "the Roman Empire", "honey bees",
    "electric cars", "the internet", "coffee", "the moon landing", "earthquakes", "vaccines",
    "recycling", "the stock market", "dinosaurs", "solar panels", "the human heart", "rainbows",
    "chess", "the printing press", "sleep", "DNA", "tea ceremonies", "the Great Wall of China",
    "octopuses", "renewable energy", "gravity", "the Renaissance", "friendship", "exercise",
    "time management", "public speaking", "gardening", "bread baking", "the ocean tides",
    "democracy", "inflation", "antibiotics", "the piano", "migration of birds", "glaciers",
    "social media", "cryptography", "the Olympic Games", "rain forests", "electricity",
    "the periodic table", "meditation", "cats", "dogs", "bicycles", "trains", "airplanes",
    "the Sahara desert", "mountains", "rivers", "libraries", "museums", "robots", "smartphones",
    "volunteering", "learning a new language", "healthy breakfast", "saving money", "pizza",
    "the solar system", "magnets", "clouds", "lightning", "penguins", "whales", "forests",
    "cities", "farming", "music festivals", "video games", "photography", "painting",
    "ancient Egypt", "the Silk Road", "the telephone", "space stations", "batteries", "wind",
]

CHAT = [
    "What is {t}?", "Explain {t} to a ten-year-old.", "Why is {t} important?",
    "Give me three interesting facts about {t}.", "How does {t} work?",
    "What are the pros and cons of {t}?", "Summarize what you know about {t} in two sentences.",
    "What is a common misconception about {t}?", "How would you explain {t} to a beginner?",
    "Tell me something surprising about {t}.", "What questions do scientists still have about {t}?",
    "Compare {t} and {u}.", "What is the connection between {t} and {u}?",
    "Hi! Can you help me understand {t}?", "I am curious about {t}. Where should I start?",
]
WRITING = [
    "Write a short poem about {t}.", "Write a haiku about {t}.",
    "Write a short story (five sentences) involving {t}.", "Write a product description for a "
    "book about {t}.", "Write an email to a friend recommending they learn about {t}.",
    "Write a tweet about {t}.", "Write a motivational paragraph about {t}.",
    "Write a limerick about {t}.", "Write the opening line of a novel about {t}.",
    "Write a short dialogue between two people discussing {t}.",
    "Rewrite this sentence to be more formal: '{t} is really cool and everybody should know it.'",
    "Write a title and a one-paragraph abstract for an article about {t} and {u}.",
]
LISTS = [
    "List five facts about {t} as a JSON array of strings.",
    "Give a bulleted list of four tips related to {t}.",
    "Return a JSON object with keys \"topic\", \"summary\" and \"keywords\" for {t}.",
    "List three books or resources about {t}.", "Make a numbered list of steps to learn about {t}.",
    "Create a table in Markdown with two columns comparing {t} and {u}.",
    "Give me a YAML list of three questions about {t}.",
    "List the key terms someone should know about {t}, with one-line definitions.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "sorts a list of "
    "dictionaries by a key", "merges two sorted lists", "finds the maximum of a list",
    "removes duplicates from a list while keeping order", "checks whether a string is a "
    "palindrome", "converts Celsius to Fahrenheit", "reads a CSV file and prints each row",
    "computes the average of a list of numbers", "flattens a nested list", "counts word "
    "frequencies in a text", "finds the greatest common divisor of two numbers",
    "checks whether two strings are anagrams", "returns the squares of the even numbers in a "
    "list", "implements binary search", "validates an email address with a regular expression",
    "sums the digits of an integer", "transposes a matrix", "capitalizes every word in a sentence",
    "returns the second largest number in a list", "converts a binary string to an integer",
    "generates a random password", "computes the length of the longest word in a sentence",
]


# Self-instruct: the target, sampling, writes one instruction per meta-prompt call. No topics are
# given, so the variety comes from the target's own distribution rather than from our lists.
META_PROMPTS = {
    "chat": ["Write one question that a curious person might ask an AI assistant. Reply with the "
             "question only.",
             "Write one question a student might ask a teacher. Reply with the question only.",
             "Give an example of a request someone might send to an AI assistant. Reply with the "
             "request only.",
             "Write a question about history, science or geography. Reply with the question only.",
             "Write a request for advice about health, money, work, study or family life. Reply "
             "with the request only."],
    "task": ["Write a short everyday task you could ask a helpful assistant to do. Reply with the "
             "task only.",
             "Write an instruction that asks for a list, a table or a JSON object. Reply with the "
             "instruction only.",
             "Write an instruction asking someone to summarize, rewrite or translate a sentence, "
             "and include the sentence. Reply with the instruction only."],
    "writing": ["Write an instruction asking for a short piece of creative writing (a poem, a "
                "story, a letter or an email). Reply with the instruction only."],
    "code": ["Write a request for a small programming task. Reply with the request only."],
    "math": ["Write a simple math word problem. Reply with the problem only."],
}


def meta_prompts() -> list[tuple[str, str]]:
    """(category, meta-prompt) pairs, in a fixed order."""
    return [(c, m) for c, ms in META_PROMPTS.items() for m in ms]


# Lines in the assistant's own voice rather than a request: an interjection ("Sure!", "Great,"; only
# with its punctuation, so "Great Wall of China ..." stays a request), a preamble ("Here's one"), an
# offer to help, or a restatement of the meta-prompt.
_NOT_A_REQUEST = re.compile(
    r"^((sure|ok|okay|certainly|absolutely|great)[!,.]|here(\W?s| is| are)\b|i['’]?m (ready|here|happy|glad)"
    r"|i am (ready|here|happy|glad)|what an? (great|good|wonderful|fantastic|interesting)"
    r"|let['’]?s\b)|\b(ai assistant|helpful assistant|reply with the|smollm)\b", re.I)


def _as_request(line: str) -> str | None:
    line = line.strip().strip("*#-").strip()
    ok = 15 <= len(line) <= 400 and not line.endswith(":") and not _NOT_A_REQUEST.search(line)
    return line if ok else None


def extract_instruction(text: str) -> str | None:
    """The instruction in a self-instruct answer: its first quoted passage, or else its first
    line, that reads as a request (15-400 characters, not a preamble ending in a colon, not the
    assistant's own voice, `_NOT_A_REQUEST`); None when there is none."""
    quoted = re.findall(r'"([^"\n]{15,400})"', text)
    return next((r for r in map(_as_request, quoted + text.splitlines()) if r), None)
