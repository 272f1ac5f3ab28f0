"""Attention masks and position depths of a draft tree, as the target's forward takes them.

Boundary: parent lists in, tensors out. Node 0 is the root; every other node's parent precedes
it. The engine's tree structure (engine/tree.py) and the target wrapper (models/target.py) both
build on these, so they live below both.
"""
from __future__ import annotations

import torch


def depths(parents: list[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: M[i, j] is True when node i may attend to node j (j is i or an ancestor)."""
    n = len(parents)
    m = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i] |= m[p]
    return m


def additive_mask(parents: list[int], past_len: int, dtype: torch.dtype,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Float additive 4D mask (1, 1, n, past_len + n): 0 = attend, finfo.min = blocked.

    Causal over the committed prefix, the ancestor mask inside the tree block (DESIGN.md §3.4:
    a boolean 4D mask would be *added* by eager attention and give wrong results).
    """
    n = len(parents)
    allowed = torch.cat([torch.ones(n, past_len, dtype=torch.bool), ancestor_mask(parents)], dim=1)
    mask = torch.zeros(n, past_len + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
