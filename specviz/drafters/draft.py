"""The separate draft model (strategy `draft`): a small Llama with the target's tokenizer, embedding
and tied LM head, distilled from the target; chain drafting with its own KV cache.

Boundary: the model, its drafter and `load_draft_lm` (the same weights as a plain
transformers LlamaForCausalLM with the full vocabulary, for HF `assistant_model`). Training
(train/draft.py) starts the layers as a copy of target layers (the first and the last), so
distillation starts from a working model. Only the layers and the final norm are shipped; the
embedding is the target's. Our drafter computes logits over a reduced draft vocabulary (the
target's rows), which keeps a draft step far cheaper than the 49152-row head.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, LlamaForCausalLM

from specviz.drafters import feature_heads as fh
from specviz.drafters import weights
from specviz.engine.cost import (Acceptance, ForwardCost, forward_cost, verify_prefix,
                                  worth_drafting)
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree
from specviz.models.kernels import Prepacked, pack_linears
from specviz.models.kvcache import new_cache

ID = "draft"


def new_lm(target, n_layers: int) -> LlamaForCausalLM:
    """An n-layer copy of the target's architecture sharing its (frozen) embedding."""
    cfg = copy.deepcopy(target.model.config)
    cfg.num_hidden_layers = n_layers
    cfg.tie_word_embeddings = True
    for key in ("layer_types",):
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, getattr(cfg, key)[:n_layers])
    lm = LlamaForCausalLM(cfg).to(target.device, torch.float32)
    emb = target.embed.weight                              # shared and frozen (fp32 targets)
    lm.model.embed_tokens.weight = emb if emb.dtype == torch.float32 else nn.Parameter(
        emb.detach().float(), requires_grad=False)
    lm.lm_head.weight = lm.model.embed_tokens.weight
    lm.model.embed_tokens.weight.requires_grad_(False)
    return lm


class DraftModel(nn.Module):
    def __init__(self, target, vocab_ids: torch.Tensor, n_layers: int = 2):
        super().__init__()
        self.vocab = target.vocab
        self.lm = new_lm(target, n_layers)
        self.register_buffer("vocab_ids", vocab_ids.long(), persistent=False)
        self.register_buffer("head_w", self.lm.model.embed_tokens.weight.detach()[vocab_ids.long()],
                             persistent=False)
        self.head_mm = Prepacked()

    def shipped(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.lm.state_dict().items()
                if not k.startswith(("model.embed_tokens", "lm_head"))}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[.., d] final hidden -> [.., Vd] logits over the draft vocabulary."""
        return self.head_mm(h, self.head_w)

    def forward(self, tokens: torch.Tensor, cache=None) -> torch.Tensor:
        out = self.lm.model(input_ids=tokens, past_key_values=cache, use_cache=cache is not None)
        return self.logits(out.last_hidden_state)


def load(target) -> DraftModel:
    tensors, cfg = weights.load(ID, target.fingerprint)
    model = DraftModel(target, tensors.pop("vocab_ids"), cfg["layers"])
    missing = model.lm.load_state_dict(tensors, strict=False).missing_keys
    if any(not k.startswith(("model.embed_tokens", "lm_head")) for k in missing):
        raise weights.DrafterUnavailable(f"{ID} weights are incomplete; retrain with: "
                                         f"python -m specviz train --drafter {ID}")
    return pack_linears(model.to(target.device).eval())


def load_draft_lm(target) -> LlamaForCausalLM:
    """The draft model as a full-vocabulary LlamaForCausalLM (HF `assistant_model`)."""
    return load(target).lm.to(target.dtype)


@dataclass(frozen=True)
class DraftSettings:
    gamma: int = 6              # longest chain
    min_confidence: float = 0.3  # no cost model: stop after a token the draft gives less than this
    auto_budget: bool = True    # greedy: draft and verify only the tokens that pay for their time
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if not 1 <= self.gamma <= 16:
            raise ValueError("draft gamma must be in 1..16")
        if not 0 <= self.min_confidence < 1:
            raise ValueError("draft min_confidence must be in [0, 1)")


@dataclass
class DraftState:
    tokens: list[int]                                   # committed tokens except the root
    cache: DynamicCache = field(default_factory=DynamicCache)
    acceptance: Acceptance = field(default_factory=Acceptance)   # learnt from verified drafts
    step_s: float = 0.0                                 # the last one-token draft step's time


class DraftLMDrafter:
    """Chain drafting. With a cost model (greedy decoding, where the chain length never changes
    the output) the chain grows while one more token can pay for its draft and verify time, and
    the prefix that maximises expected tokens per second is verified, as `eagle2` does for a
    tree: a token's value is the product along the chain of the request's learnt acceptance of
    each draft probability (`cost.Acceptance`). Otherwise the chain stops after the first token
    the draft gives less than `min_confidence`."""
    taps: tuple[int, ...] = ()

    def __init__(self, model: DraftModel, settings: DraftSettings, cost: ForwardCost | None = None):
        self.model, self.settings, self.cost = model, settings, cost
        self.vocab = model.vocab
        self.vocab_ids = model.vocab_ids

    def start(self, prompt_ids, feats) -> DraftState:
        return DraftState(list(prompt_ids[:-1]), new_cache(self.model.lm.config))

    @torch.no_grad()
    def draft(self, state: DraftState, root: int, sp: SamplingParams, generator) -> DraftTree:
        t0 = time.perf_counter()
        dev = self.vocab_ids.device
        done = state.cache.get_seq_length()
        feed = state.tokens[done:] + [root]
        picks, values = [], []
        s, cost = self.settings, self.cost if sp.greedy else None
        why = ""
        while len(picks) < s.gamma:
            if cost is not None and picks and not worth_drafting(
                    values, 1, values[-1], time.perf_counter() - t0, state.step_s, cost):
                why = " (stopped: one more token would not pay for its time)"
                break
            t = time.perf_counter()
            logits = self.model(torch.tensor([feed], device=dev), state.cache)[0, -1]
            picks.append(fh.pick(self, logits, sp, generator))
            # one token's step time; a catch-up step over several tokens gives a first guess
            if len(feed) == 1 or not state.step_s:
                state.step_s = (time.perf_counter() - t) / len(feed)
            feed = [picks[-1][0]]
            conf = picks[-1][3]                         # the draft's own, never the target's
            values.append(state.acceptance(conf) * (values[-1] if values else 1.0))
            if cost is None and conf < s.min_confidence:
                why = f" (stopped: confidence < {s.min_confidence})"
                break
        note = f"draft model, chain of {len(picks)}{why}"
        if cost is not None:
            n, cut = verify_prefix(values, time.perf_counter() - t0, cost)
            note += cut
            picks = picks[:n]
        toks, qs, rows, confs = (list(x) for x in zip(*picks)) if picks else ([], [], [], [])
        greedy = sp.greedy
        return state.acceptance.expect(DraftTree.chain(
            root, toks, q=None if greedy else qs, q_rows=None if greedy else rows,
            confidence=confs, note=note))

    def commit(self, state: DraftState, tokens, feats) -> None:
        # tokens = root + accepted drafts: the cache already holds them (same tokens, same
        # positions); drop only the rejected tail (and any drafted tokens not sent to verify)
        state.acceptance.settle(tokens)
        state.tokens.extend(tokens)
        n = state.cache.get_seq_length() - len(state.tokens)
        if n > 0:
            state.cache.crop(-n)

    def cache_len(self, state: DraftState) -> int:
        return state.cache.get_seq_length()


def build(target, settings: DraftSettings) -> DraftLMDrafter:
    return DraftLMDrafter(load(target), settings,
                          forward_cost(target) if settings.auto_budget else None)
