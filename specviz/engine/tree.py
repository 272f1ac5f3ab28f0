"""Draft trees as nodes with parent indices, and everything derived from them.

Boundary: pure structure. Node 0 is the root (the last committed token, already known to the
target); every other node's parent precedes it. Nodes are kept in depth order so that
truncating a draft to depth <= L keeps a prefix of the node list.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.models.masks import depths


@dataclass
class Schedule:
    """A confidence-prefix decision made before the truncated tokens were looked at."""
    confidence: list[float]
    survival: list[float]
    verify_len: int
    reason: str
    threshold: float | None = None


@dataclass
class DraftTree:
    """tokens[i] with parent parents[i] (-1 for the root).

    q[i]: probability the drafter gave tokens[i] (None: deterministic choice, q one-hot).
    q_rows[i]: the full draft distribution tokens[i] was *sampled* from ([V] tensor), or None for
    deterministic (argmax / top-k) nodes. Verification uses the matching §0 rule per node.
    """
    tokens: list[int]
    parents: list[int]
    q: list[float | None] = field(default_factory=list)
    q_rows: list[torch.Tensor | None] = field(default_factory=list)
    confidence: list[float | None] = field(default_factory=list)
    schedule: Schedule | None = None
    fallback: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n or n == 0 or self.parents[0] != -1:
            raise ValueError("a draft tree needs a root (parent -1) and one parent per node")
        for i, p in enumerate(self.parents[1:], 1):
            if not 0 <= p < i:
                raise ValueError(f"node {i}: parent {p} must precede it")
        self.q = self.q or [None] * n
        self.q_rows = self.q_rows or [None] * n
        self.confidence = self.confidence or [None] * n
        d = depths(self.parents)
        if any(a > b for a, b in zip(d, d[1:])):
            raise ValueError("nodes must be in depth order")

    @classmethod
    def root_only(cls, root: int, note: str = "", fallback: bool = False) -> "DraftTree":
        return cls([root], [-1], note=note, fallback=fallback)

    @classmethod
    def chain(cls, root: int, tokens: list[int], q: list[float | None] | None = None,
              q_rows: list[torch.Tensor | None] | None = None,
              confidence: list[float | None] | None = None, **kw) -> "DraftTree":
        n = len(tokens)
        return cls([root, *tokens], list(range(-1, n)),
                   q=[None, *(q or [None] * n)], q_rows=[None, *(q_rows or [None] * n)],
                   confidence=[None, *(confidence or [None] * n)], **kw)

    @classmethod
    def in_depth_order(cls, root: int, tokens: list[int], parents: list[int], depths: list[int],
                       confidence: list[float | None], note: str = "") -> "DraftTree":
        """Drafted nodes in any order (parents[i]: an index into the same lists, -1 = the root;
        depths[i] >= 1) -> the tree with its nodes sorted by depth, stable within a depth."""
        order = sorted(range(len(tokens)), key=lambda i: (depths[i], i))
        where = {i: j + 1 for j, i in enumerate(order)}
        return cls([root, *(tokens[i] for i in order)],
                   [-1, *(0 if parents[i] < 0 else where[parents[i]] for i in order)],
                   confidence=[None, *(confidence[i] for i in order)], note=note)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        return depths(self.parents)

    def truncate(self, max_depth: int) -> "DraftTree":
        """The nodes of depth <= max_depth (a prefix, since nodes are in depth order)."""
        keep = sum(1 for d in self.depths if d <= max_depth)
        return DraftTree(self.tokens[:keep], self.parents[:keep], self.q[:keep], self.q_rows[:keep],
                         self.confidence[:keep], self.schedule, self.fallback, self.note)


def after_chain(n: int, parents: list[int]) -> list[int]:
    """Parents of n chained tokens followed by a tree whose root continues the chain: one
    forward then runs a prompt and the first draft tree together."""
    return list(range(-1, n - 1)) + [n - 1 if p < 0 else p + n for p in parents]


def children(parents: list[int]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            out[p].append(i)
    return out


def paths(parents: list[int]) -> list[list[int]]:
    """Root-to-leaf node-id paths (the `retrieve` indices of Medusa/EAGLE)."""
    kids = children(parents)
    out = []
    for leaf in (i for i, k in enumerate(kids) if not k):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        out.append(path[::-1])
    return out
