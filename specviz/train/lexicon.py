"""An open vocabulary for the version-3 instruction sources: thousands of everyday nouns by kind
(food, animal, artifact, ...) and verbs of activity, and short natural example sentences, taken
once from WordNet and kept as the committed file data/lexicon.tsv, so that the instruction
stream stays reproducible on machines without WordNet.

Boundary: text only, no model, no randomness. `build(wordnet_dir)` reads WordNet 3.0's database
files (Debian's wordnet-base: data.noun, data.verb, cntlist.rev) and returns rows; `write`
stores them; `load()` reads the committed file for sources.py. Rebuild it with
`python -m specviz.train.lexicon /usr/share/wordnet` (then bump sources.VERSION: the stream
depends on the file's content).
Selection: a lemma counts by its commonest sense in the SemCor tag counts (cntlist.rev), which
also gives its kind (the sense's lexicographer file); only lemmas tagged at least MIN_COUNT
times, of at most two words and plain letters, are kept, so the words are common ones; names
(capitalised forms) only as places.
Examples are the quoted usage examples of WordNet's glosses of 6-18 words.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

LEXICON = Path(__file__).resolve().parents[2] / "data" / "lexicon.tsv"
MIN_COUNT = 1
NOUN_FILES = {4: "act", 5: "animal", 6: "artifact", 7: "attribute", 8: "body", 9: "cognition",
              10: "communication", 11: "event", 12: "feeling", 13: "food", 14: "group",
              15: "location", 17: "object", 18: "person", 19: "phenomenon", 20: "plant",
              21: "possession", 22: "process", 26: "state", 27: "substance", 28: "time"}
VERB_FILES = {29: "body", 30: "change", 31: "cognition", 32: "communication", 33: "competition",
              34: "consumption", 35: "contact", 36: "creation", 38: "motion", 41: "social"}
WORD = re.compile(r"[a-z]+(?: [a-z]+)?")
EXAMPLE = re.compile(r'"([^"]+)"')


def synsets(path: Path) -> Iterator[tuple[int, list[tuple[str, int]], str]]:
    """(lexicographer file number, [(word, lex_id)], gloss) of each synset of a data.* file."""
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(" "):                        # the licence header
            continue
        head, _, gloss = line.partition(" | ")
        f = head.split()
        n = int(f[3], 16)
        words = [(f[4 + 2 * i].replace("_", " "), int(f[5 + 2 * i], 16)) for i in range(n)]
        yield int(f[1]), words, gloss.strip()


def tag_counts(path: Path) -> dict[str, int]:
    """sense key -> SemCor tag count, from cntlist.rev lines `key sense_number count`."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, count = line.split()
        out[key] = int(count)
    return out


def build(wordnet: Path) -> list[tuple[str, str, str]]:
    """Rows (kind: noun | verb | example, category, text), sorted."""
    counts = tag_counts(wordnet / "cntlist.rev")
    best: dict[tuple[str, str], tuple[int, str, str]] = {}   # (pos, lemma) -> (count, cat, form)
    examples = set()
    for pos, ss, files in (("noun", 1, NOUN_FILES), ("verb", 2, VERB_FILES)):
        for lexfile, words, gloss in synsets(wordnet / f"data.{pos}"):
            examples.update(e.strip() for e in EXAMPLE.findall(gloss)
                            if 6 <= len(e.split()) <= 18 and e[:1].islower())
            if lexfile not in files:
                continue
            for form, lex_id in words:
                lemma = form.lower()
                key = lemma.replace(" ", "_")
                count = counts.get(f"{key}%{ss}:{lexfile:02d}:{lex_id:02d}::", 0)
                proper = form != lemma and files[lexfile] != "location"
                if count >= MIN_COUNT and WORD.fullmatch(lemma) and not proper and \
                        count > best.get((pos, lemma), (0,))[0]:
                    best[(pos, lemma)] = (count, files[lexfile], form)
    rows = {(pos, cat, form) for (pos, _), (_, cat, form) in best.items()}
    rows |= {("example", "", e[0].upper() + e[1:].rstrip(".") + ".") for e in examples
             if "\t" not in e}
    return sorted(rows)


def write(rows: list[tuple[str, str, str]], path: Path = LEXICON) -> None:
    path.write_text("".join(f"{k}\t{c}\t{t}\n" for k, c, t in rows))


@lru_cache(maxsize=2)
def load(path: Path = LEXICON) -> dict[str, dict[str, tuple[str, ...]]]:
    """{kind: {category: words or sentences}} from the committed file (examples: category "")."""
    out: dict[str, dict[str, list[str]]] = {}
    for line in Path(path).read_text().splitlines():
        kind, cat, text = line.split("\t")
        out.setdefault(kind, {}).setdefault(cat, []).append(text)
    return {k: {c: tuple(v) for c, v in d.items()} for k, d in out.items()}


if __name__ == "__main__":
    write(build(Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/share/wordnet")))
