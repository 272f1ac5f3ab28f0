"""What drafters share: the error a drafter raises when it cannot be used.

Boundary: drafter-side definitions only; the protocol the decode loop talks to is
specviz/engine/drafter.py.
"""
from __future__ import annotations


class DrafterUnavailable(RuntimeError):
    """A drafter cannot be used (weights missing or for another target); the message says why
    and how to fix it."""
