"""Lossless verification of a draft tree (ALGORITHMS.md §0). Pure: no model calls.

Notation at every rule: p is the TARGET distribution, q the DRAFT distribution, both after the
same temperature / top-p / top-k transform (sampling.probs).

- Greedy: descend while a child equals argmax p; then emit argmax p (correction, or bonus).
- Sampling, a child drawn from q (q row known): accept x with min(1, p(x)/q(x)); on rejection
  p <- norm(max(0, p - q)) and try the next sibling (Leviathan et al. 2023; Chen et al. 2023;
  recursive rejection sampling for trees, SpecInfer / EAGLE).
- Sampling, a deterministic child (argmax / top-k, q one-hot): accept x with p(x); on rejection
  zero p[x], renormalize, try the next sibling.
- Every child rejected: sample from the current (residual) p. Path fully accepted to a leaf:
  sample the bonus token from the leaf's p.
Residual mass <= 1e-8 falls back to the unmodified p.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.engine.sampling import SamplingParams, sample, uniform
from specviz.engine.tree import DraftTree, children

RESIDUAL_EPS = 1e-8


@dataclass
class Verdict:
    path: list[int]            # accepted node ids, root first
    token: int                 # the token the target adds (correction or bonus)
    source: str                # "bonus" | "argmax" | "residual" | "sample"
    draws: list[float | None]  # per node: the uniform draw used to test it (None if untested)


def verify(tree: DraftTree, p_rows: torch.Tensor, sp: SamplingParams,
           generator: torch.Generator | None) -> Verdict:
    """Walk the tree from the root with the target's distributions.

    p_rows: [n_nodes, V] target probabilities (already transformed); row i is the target's
    distribution for the token that follows node i. Greedy only takes each row's argmax, so
    raw logits serve as well there.
    """
    kids = children(tree.parents)
    draws: list[float | None] = [None] * len(tree)
    path = [0]
    cur = 0
    while True:
        if sp.greedy:
            target_tok = int(p_rows[cur].argmax())
            nxt = next((c for c in kids[cur] if tree.tokens[c] == target_tok), None)
            if nxt is None:
                source = "bonus" if not kids[cur] and cur != 0 else "argmax"
                return Verdict(path, target_tok, source, draws)
        else:
            nxt, p = _sample_children(tree, kids[cur], p_rows[cur], draws, generator)
            if nxt is None:
                if not kids[cur]:
                    source = "bonus" if cur != 0 else "sample"
                else:
                    source = "residual"
                return Verdict(path, sample(p, generator), source, draws)
        path.append(nxt)
        cur = nxt


def _sample_children(tree: DraftTree, kids: list[int], p: torch.Tensor, draws: list[float | None],
                     generator: torch.Generator | None) -> tuple[int | None, torch.Tensor]:
    """Recursive rejection sampling over one node's children. Returns (accepted child, p)."""
    p_orig = p
    p = p.clone()
    for c in kids:
        x = tree.tokens[c]
        q_row = tree.q_rows[c]
        r = uniform(generator)
        draws[c] = r
        if q_row is None:                       # deterministic child: q = one-hot(x)
            if r < float(p[x]):
                return c, p
            p[x] = 0.0
        else:                                   # sampled child: q = q_row
            qx = float(q_row[x])
            if qx > 0 and r < min(1.0, float(p[x]) / qx):
                return c, p
            p = torch.clamp(p - q_row.to(p), min=0.0)
        mass = float(p.sum())
        if mass <= RESIDUAL_EPS:
            return None, p_orig
        p = p / mass
    return None, p
