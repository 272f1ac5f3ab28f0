"""EAGLE-1's static tree, chosen from measured acceptance (`python -m specviz train tree`).

EAGLE-1 drafts a fixed tree of rank paths: (0,) is the head's likeliest first token, (1, 0) the
likeliest child of its second likeliest, and so on. Under greedy verification a node is accepted
exactly when its path is a prefix of the step's accepted path. So one set of engine runs with a
wide tree tells, for every sub-tree of it at once, how many draft tokens it would have accepted
at those steps: the number of its paths that were a prefix of the accepted one. Counting each
path over the steps, the N most counted paths are a tree (a prefix counts at least as often as
its extensions) and the N-node sub-tree of the wide one that accepts the most on those steps.
This is how Medusa and EAGLE-1 picked their fixed trees: from measured acceptance, not by hand.

Boundary: greedy engine runs of the shipped eagle1 head with a wide tree, on held-out
instructions that no training shard answers (train/recalibrate.py's), the counting and the
choice. It writes nothing: drafters/eagle.py keeps the chosen tree as STATIC_TREE.
"""
from __future__ import annotations

from collections import Counter
from itertools import product

from specviz import events as ev
from specviz.drafters import eagle
from specviz.engine.decode import GenSettings, run

RankPath = tuple[int, ...]


def wide(depth: int = 8) -> list[RankPath]:
    """The candidate paths, depth-ordered: up to `depth` levels, ranks 0-3, with a rank sum of
    at most 3 in the first three levels, 2 through level 6 and 1 beyond (prefix-closed: the
    allowance never grows with depth)."""
    allow = lambda n: 3 if n <= 3 else 2 if n <= 6 else 1   # noqa: E731
    return [p for n in range(1, depth + 1) for p in product(range(4), repeat=n)
            if sum(p) <= allow(n)]


def static_drafter(target, shape: list[RankPath]) -> eagle.EagleDrafter:
    """The shipped eagle1 head drafting the static tree `shape` instead of STATIC_TREE."""
    drafter = eagle.EagleDrafter(eagle.load_head(target), None)
    drafter.shape = shape
    return drafter


def accepted_paths(target, prompts: list[list[int]], max_new_tokens: int, shape: list[RankPath],
                   log=print) -> list[list[RankPath]]:
    """Per prompt (token ids), the deepest accepted path of every step of its greedy eagle1 run
    drafting the depth-ordered tree `shape`; () where no draft was accepted."""
    drafter = static_drafter(target, shape)
    node_path = [()] + list(shape)    # tree node i + 1 is shape[i]: to_tree orders by depth
    out: list[list[RankPath]] = []
    for i, ids in enumerate(prompts):
        out.append([])
        for e in run(target, ids, GenSettings(max_new_tokens=max_new_tokens), drafter):
            if isinstance(e, ev.DraftProposed) and len(e.tokens) != len(node_path):
                raise RuntimeError(f"the head drafted {len(e.tokens) - 1} of {len(shape)} nodes")
            if isinstance(e, ev.Accepted):
                out[-1].append(node_path[e.path[-1]])
        log(f"tree prompt {i + 1}/{len(prompts)}: {len(out[-1])} steps")
    return out


def prefix_counts(paths: list[RankPath]) -> Counter:
    """How many of `paths` each path is a prefix of (itself included; () excluded)."""
    return Counter(p[:k] for p in paths for k in range(1, len(p) + 1))


def choose(counts: Counter, shape: list[RankPath], n: int) -> list[RankPath]:
    """The n paths of `shape` most often accepted (ties: shallower, then lower ranks), in depth
    order: a tree, since a prefix is counted at least as often as its extensions and sorts
    before them on a tie."""
    best = sorted(shape, key=lambda p: (-counts[p], len(p), p))[:n]
    return sorted(best, key=lambda p: (len(p), p))


def expected_tau(counts: Counter, steps: int, tree: list[RankPath]) -> float:
    """Tokens per target forward the tree would have given on the measured steps: its accepted
    drafts plus the target's own token."""
    return 1 + sum(counts[p] for p in tree) / steps


def measure(target, prompts: list[list[int]], max_new_tokens: int, nodes: int, log=print
            ) -> dict:
    """Choose the `nodes`-node tree on the engine runs of the even-numbered prompts, and score
    it against the shipped STATIC_TREE on those of the odd-numbered ones (held out)."""
    shape = wide()
    if not set(eagle.STATIC_TREE) <= set(shape):
        raise ValueError("the shipped STATIC_TREE has paths outside the wide tree: widen it")
    if len(prompts) < 2:
        raise ValueError("give two prompts at least: one half chooses, the other scores")
    runs = accepted_paths(target, prompts, max_new_tokens, shape, log)
    fit = [p for r in runs[0::2] for p in r]
    held = [p for r in runs[1::2] for p in r]
    tree = choose(prefix_counts(fit), shape, nodes)
    counts = prefix_counts(held)
    return {"prompts": len(prompts), "fit_steps": len(fit), "held_out_steps": len(held),
            "wide_nodes": len(shape), "tau_wide": expected_tau(counts, len(held), shape),
            "tau_chosen": expected_tau(counts, len(held), tree),
            "tau_shipped": expected_tau(counts, len(held), eagle.STATIC_TREE),
            "tree": [list(p) for p in tree]}
