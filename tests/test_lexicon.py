"""The version-3 open vocabulary (lexicon.py) and the stream's sources that use it."""
from __future__ import annotations

from specviz.train import lexicon, sources

DATA_NOUN = """  1 This software and database is being provided to you, the LICENSEE, by
00001740 13 n 02 apple 0 orchard_apple 0 000 | fruit with red or yellow skin; "she ate a crisp apple for lunch"
00001741 13 n 01 Jonagold 0 000 | a variety of apple
00001742 05 n 01 dog 0 000 | a domesticated canine; "the dog barked at the mailman all night"
00001743 06 n 01 dog 1 000 | a metal support for logs; "short"
00001744 15 n 01 Paris 0 000 | the capital of France
00001745 03 n 01 entity 0 000 | that which exists; "the entity was never seen again by anyone"
"""
DATA_VERB = """00002000 38 v 01 swim 0 000 | travel through water; "we had to swim for 20 minutes to reach the shore"
"""
COUNTS = """apple%1:13:00:: 1 9
orchard_apple%1:13:00:: 1 1
jonagold%1:13:00:: 1 4
dog%1:05:00:: 1 40
dog%1:06:01:: 2 3
paris%1:15:00:: 1 5
entity%1:03:00:: 1 11
swim%2:38:00:: 1 6
"""


def test_build_keeps_common_lemmas_by_their_commonest_sense(tmp_path):
    for name, text in (("data.noun", DATA_NOUN), ("data.verb", DATA_VERB),
                       ("cntlist.rev", COUNTS)):
        (tmp_path / name).write_text(text)
    rows = lexicon.build(tmp_path)
    words = {(k, c, t) for k, c, t in rows if k != "example"}
    assert words == {("noun", "food", "apple"), ("noun", "food", "orchard apple"),
                     ("noun", "animal", "dog"), ("noun", "location", "Paris"),
                     ("verb", "motion", "swim")}       # no proper name but places, no Tops
    examples = {t for k, _, t in rows if k == "example"}
    assert examples == {"She ate a crisp apple for lunch.", "The dog barked at the mailman all night.",
                        "We had to swim for 20 minutes to reach the shore.",
                        "The entity was never seen again by anyone."}   # 6-18 words only
    lexicon.write(rows, tmp_path / "lexicon.tsv")
    back = lexicon.load(tmp_path / "lexicon.tsv")
    assert back["noun"]["food"] == ("apple", "orchard apple")
    assert len(back["example"][""]) == 4


def test_committed_lexicon_is_wide():
    lex = lexicon.load()
    nouns = {w for ws in lex["noun"].values() for w in ws}
    verbs = {w for ws in lex["verb"].values() for w in ws}
    assert len(nouns) > 8000 and len(verbs) > 2000 and len(lex["example"][""]) > 5000
    assert {"food", "animal", "artifact", "person", "location"} <= set(lex["noun"])


def test_version_3_sources_fill_every_slot_from_the_lexicon():
    items = sources.take(3000, version="3")
    assert {x["source"] for x in items} == set(sources.SOURCES["3"])
    assert not any("{" in x["prompt"] and "}" in x["prompt"] and "JSON" not in x["prompt"]
                   for x in items)
    nouns = {w for ws in lexicon.load()["noun"].values() for w in ws}
    used = {w for w in nouns for x in items if x["source"] == "noun" and f" {w}" in x["prompt"]}
    assert len(used) > 500            # an open vocabulary, not a topic list


def test_version_4_crosses_version_2_kinds_with_the_lexicon():
    """Version 4 keeps version 2's kinds of request (its sources are a subset of 2's and 3's)
    and fills their slots from the lexicon instead of version 2's short lists."""
    v4 = sources.take(4000, version="4")
    assert {x["source"] for x in v4} == set(sources.SOURCES["4"])
    assert set(sources.SOURCES["4"]) <= set(sources.SOURCES["2"]) | set(sources.SOURCES["3"])
    nouns = {w for ws in lexicon.load()["noun"].values() for w in ws}
    for src in ("code", "structured", "steps", "reading", "code_read"):
        texts = [x["prompt"] for x in v4 if x["source"] == src]
        used = {w for w in nouns for t in texts if f" {w} " in t or f" {w}s" in t
                or f"\"{w}\"" in t}
        assert len(used) > len(texts) // 10, src      # open vocabulary, not version 2's lists
    assert not any("{" in x["prompt"] and x["source"] in ("code", "structured", "rewrite")
                   for x in v4)
    for x, _ in sources.wide()["entities"]:
        assert sources.plural_safe(x)                 # the templates write "{e}s"
