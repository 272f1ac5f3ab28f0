"""The strategy registry: strategy id -> drafter + settings. The one place that knows every drafter.

Boundary: names, summaries, settings dataclasses and construction (with a per-target cache, so
weights load once per process and the n-gram store persists across requests). CLI, bench and
UI list strategies from here.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Callable

from specviz.drafters.base import Drafter, DrafterUnavailable
from specviz.drafters.ngram import NgramDrafter, NgramSettings


class UnknownStrategy(ValueError):
    pass


@dataclass(frozen=True)
class StrategySpec:
    id: str
    label: str
    summary: str
    settings: type | None = None                     # a frozen dataclass of the strategy's knobs
    build: Callable[[Any, Any], Drafter] | None = None  # (target, settings) -> drafter
    caveat: str = ""


def _ngram(target, s: NgramSettings) -> Drafter:
    if target.device.type == "cuda" and s.min_expected == NgramSettings.min_expected:
        # on a GPU a verify of a few tokens costs about one plain step: no need to gate
        s = dataclasses.replace(s, min_expected=0.0)
    return NgramDrafter(s)


REGISTRY: dict[str, StrategySpec] = {s.id: s for s in [
    StrategySpec("ar", "Autoregressive (reference)",
                 "Plain decoding: one target forward per token. The reference for speed and for "
                 "losslessness."),
    StrategySpec("ngram", "N-gram / prompt lookup",
                 "Match the last 3..1 tokens against the prompt, the output and a cross-request "
                 "store; several continuations form a tree. No training.",
                 NgramSettings, _ngram,
                 caveat="Shines when the answer copies from the prompt (summaries, QA over a "
                        "passage, code edits); gains little on open-ended chat."),
]}

_cache: dict[tuple, Drafter] = {}
_lock = threading.Lock()


def spec(strategy_id: str) -> StrategySpec:
    if strategy_id not in REGISTRY:
        raise UnknownStrategy(f"unknown strategy {strategy_id!r}; choose from: "
                              f"{', '.join(REGISTRY)}")
    return REGISTRY[strategy_id]


def parse_settings(strategy_id: str, overrides: dict[str, Any] | None = None):
    """The strategy's settings dataclass with overrides (strings are converted by field type)."""
    sp = spec(strategy_id)
    overrides = overrides or {}
    if sp.settings is None:
        if overrides:
            raise ValueError(f"strategy {strategy_id!r} has no settings")
        return None
    fields = {f.name: f for f in dataclasses.fields(sp.settings)}
    values = {}
    for k, v in overrides.items():
        if k not in fields:
            raise ValueError(f"strategy {strategy_id!r} has no setting {k!r}; "
                             f"it has: {', '.join(fields)}")
        kind = type(fields[k].default)
        try:
            if kind is bool and isinstance(v, str):
                if v.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                v = v.lower() in ("true", "1", "yes")
            else:
                v = kind(v)
        except (TypeError, ValueError):
            raise ValueError(f"setting {k}={v!r} is not a valid {kind.__name__}") from None
        values[k] = v
    settings = sp.settings(**values)
    check = getattr(settings, "check", None)
    if check:
        check()
    return settings


def drafter_for(target, strategy_id: str, settings=None) -> Drafter | None:
    """The (cached) drafter of a strategy for this target; None for `ar`.

    Raises DrafterUnavailable with a how-to-fix message when weights are missing or mismatched.
    """
    sp = spec(strategy_id)
    if sp.build is None:
        return None
    settings = settings if settings is not None else parse_settings(strategy_id)
    key = (id(target), strategy_id, settings)
    with _lock:
        if key not in _cache:
            _cache[key] = sp.build(target, settings)
        return _cache[key]


def settings_dict(settings) -> dict[str, Any]:
    return dataclasses.asdict(settings) if settings is not None else {}


def available(target) -> dict[str, str | None]:
    """strategy id -> None if usable, else the reason it is not."""
    out: dict[str, str | None] = {}
    for sid in REGISTRY:
        try:
            drafter_for(target, sid)
            out[sid] = None
        except DrafterUnavailable as exc:
            out[sid] = str(exc)
    return out
