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

from specviz.drafters.base import DrafterUnavailable
from specviz.engine.drafter import Drafter
from specviz.drafters.dflash import DFlashSettings, build_dflash
from specviz.drafters.dspark import DSparkSettings, build_dspark
from specviz.drafters.mtp import MtpSettings, build_mtp
from specviz.drafters.draft import DraftSettings, build as build_draft
from specviz.drafters.eagle import Eagle1Settings, Eagle2Settings, build_eagle1, build_eagle2
from specviz.drafters.eagle3 import Eagle3Settings, build as build_eagle3
from specviz.drafters.ngram import NgramDrafter, NgramSettings
from specviz.drafters.peagle import PEagleSettings, build as build_peagle
from specviz.engine.cost import forward_cost
from specviz.models.kernels import check_precision, linear_precision, resolve_precision


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
    return NgramDrafter(s, stop_ids=frozenset(target.tokenizer.all_special_ids) | target.eos_ids,
                        cost=forward_cost(target))


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
    StrategySpec("draft", "Draft model",
                 "A separate 2-layer Llama with the target's tokenizer, embedding and LM head, "
                 "distilled from the target; drafts a chain of up to gamma tokens with its own KV "
                 "cache. Under greedy decoding the chain stops once one more token would not pay "
                 "for its draft and verify time; under sampling, after a token it is unsure of.",
                 DraftSettings, build_draft,
                 caveat="Trained at reduced scale on CPU (see assets/draft.md)."),
    StrategySpec("eagle1", "EAGLE-1 (static tree)",
                 "A feature head: fc(cat(embedding, target last feature)) -> one decoder layer "
                 "predicts the next feature; the target's LM head turns it into tokens. Drafts "
                 "a fixed 20-node tree of top-ranked children.",
                 Eagle1Settings, build_eagle1,
                 caveat="Trained at reduced scale on CPU (see assets/eagle1.md)."),
    StrategySpec("eagle2", "EAGLE-2 (dynamic tree)",
                 "The EAGLE-1 head with EAGLE-2's dynamic tree: expand the top_k most likely "
                 "paths for depth levels, keep the total_tokens best nodes by cumulative draft "
                 "probability. Under greedy decoding it stops drafting, and verifies only the "
                 "best nodes, where more would cost more time than they save (auto_budget).",
                 Eagle2Settings, build_eagle2,
                 caveat="Same weights as eagle1 (see assets/eagle1.md)."),
    StrategySpec("eagle3", "EAGLE-3",
                 "Three fused target layers (low, mid, high), direct token prediction over a "
                 "reduced draft vocabulary, trained with training-time test; dynamic tree or "
                 "chain (mode).",
                 Eagle3Settings, build_eagle3,
                 caveat="Trained at reduced scale on CPU (see assets/eagle3.md)."),
    StrategySpec("peagle", "P-EAGLE (parallel drafting)",
                 "EAGLE-3 features and a 2-layer drafter that proposes k tokens in ONE forward: "
                 "the real feature at the first position, a learned hidden state and mask "
                 "embedding at the others. Under greedy decoding only the prefix worth its "
                 "verify time goes to the target (auto_budget).",
                 PEagleSettings, build_peagle,
                 caveat="Trained at reduced scale on CPU (see assets/peagle.md)."),
    StrategySpec("mtp", "MTP (DeepSeek-V3 style)",
                 "One multi-token-prediction module on the target's last hidden state: "
                 "cat(embedding, hidden) -> one transformer block -> the shared LM head, reused "
                 "autoregressively for gamma drafts. auto_budget=true verifies only the "
                 "prefix worth its time under greedy decoding.",
                 MtpSettings, build_mtp,
                 caveat="Post-trained here on a frozen target; real MTP (DeepSeek-V3) is trained "
                        "jointly with the model and accepts far more."),
    StrategySpec("dflash", "DFlash (block-parallel)",
                 "Fused features of target layers 1, 14, 27 injected as keys/values into the "
                 "drafter; one non-causal forward over [anchor, MASK x (B-1)] drafts a whole "
                 "block. block_size picks the model (8 or 16); window limits the context. Under "
                 "greedy decoding only the prefix of the block worth its verify time goes to "
                 "the target (auto_budget).",
                 DFlashSettings, build_dflash,
                 caveat="Trained at reduced scale on CPU: acceptance falls off quickly after the "
                        "first few block positions."),
    StrategySpec("dspark", "DSpark (block + Markov + confidence)",
                 "DFlash-style block drafter whose anchor also predicts, a Markov head "
                 "(previous token -> logit bias) sampled left to right, and a calibrated "
                 "confidence head: the draft is cut where the prefix survival a_j falls below "
                 "the threshold, decided before the token is looked at.",
                 DSparkSettings, build_dspark,
                 caveat="Trained at reduced scale on CPU; markov=false is the backbone-only "
                        "ablation (its confidences are then no longer calibrated)."),
]}

# Drafters are cached in their target's own `drafters` dict, {(strategy id, settings): drafter}.
# Elsewhere they would outlive it or keep it alive: an id() key was reused by a new target, which
# picked up the old one's drafters (and their n-gram store); a weak key never died, since the
# drafters hold their target.
_lock = threading.Lock()


def spec(strategy_id: str) -> StrategySpec:
    if strategy_id not in REGISTRY:
        raise UnknownStrategy(f"unknown strategy {strategy_id!r}; choose from: "
                              f"{', '.join(REGISTRY)}")
    return REGISTRY[strategy_id]


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """["KEY=VALUE", ...] -> {KEY: VALUE} (strings; parse_settings converts them)."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"a strategy setting takes KEY=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """A bench variant "ID[:KEY=VALUE[:KEY=VALUE...]]" -> (strategy id, overrides); checked."""
    sid, *pairs = (x.strip() for x in text.split(":"))
    overrides = parse_pairs(pairs)
    parse_settings(sid, overrides)
    return sid, overrides


def parse_sets(items: list[str]) -> dict[str, dict[str, str]]:
    """["STRATEGY:KEY=VALUE", ...] -> {strategy: {key: value}}, each checked."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        sid, sep, pair = item.partition(":")
        if not sep:
            raise ValueError(f"a per-strategy setting takes STRATEGY:KEY=VALUE, got {item!r}")
        out.setdefault(sid.strip(), {}).update(parse_pairs([pair]))
        parse_settings(sid.strip(), out[sid.strip()])
    return out


# Site-wide defaults under every request's own overrides (app.py --set / $SPECVIZ_SET): e.g. a
# Space serving Qwen3-4B points `dflash` at a published drafter folder with path=.
DEFAULTS: dict[str, dict[str, str]] = {}


def set_defaults(sets: dict[str, dict[str, str]]) -> None:
    for sid, pairs in sets.items():
        parse_settings(sid, pairs)
    DEFAULTS.clear()
    DEFAULTS.update(sets)


def parse_settings(strategy_id: str, overrides: dict[str, Any] | None = None):
    """The strategy's settings dataclass: the site defaults, then the overrides (strings are
    converted by field type)."""
    sp = spec(strategy_id)
    overrides = {**DEFAULTS.get(strategy_id, {}), **(overrides or {})}
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
    check_precision(getattr(settings, "precision", "auto"))
    return settings


def built_in_precision(target, settings):
    """The context a drafter with these settings is built in: its linear layers compute in the
    settings' `precision` as this device resolves it (kernels.linear_precision)."""
    return linear_precision(resolve_precision(getattr(settings, "precision", "fp32"),
                                              target.device))


def drafter_for(target, strategy_id: str, settings=None) -> Drafter | None:
    """The (cached) drafter of a strategy for this target; None for `ar`.

    Raises DrafterUnavailable with a how-to-fix message when weights are missing or mismatched,
    and ValueError for precision=bf16 where the CPU or torch build has no bfloat16 linear.
    """
    sp = spec(strategy_id)
    if sp.build is None:
        return None
    settings = settings if settings is not None else parse_settings(strategy_id)
    key = (strategy_id, settings)
    with _lock:
        if key not in target.drafters:
            with built_in_precision(target, settings):
                if getattr(settings, "path", ""):   # a published folder replaces shipped weights
                    from specviz.drafters import published
                    target.drafters[key] = published.build(strategy_id, target, settings)
                else:
                    target.drafters[key] = sp.build(target, settings)
        return target.drafters[key]


def forget(target) -> None:
    """Drop this target's drafters, and with them what they learnt across requests (the n-gram
    store): the next request builds fresh ones, as a new process would."""
    with _lock:
        target.drafters.clear()


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
