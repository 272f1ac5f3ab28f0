"""Training of the EAGLE-family feature heads (drafters/feature_heads.py's heads): the
training-time unroll and the loss and evaluation shared by EAGLE-3 and P-EAGLE.

Boundary: teacher-forced unrolled forwards of a head over a TrainData batch (EAGLE-3's
training-time test), soft-label CE against the target's stored distribution, greedy hit rates,
and `UnrolledTrainable`. No drafting policy (drafters/feature_heads.py), no data loading.
"""
from __future__ import annotations

import torch

from specviz.drafters.feature_heads import cat_kv
from specviz.drafters.layers import vocab_lookup
from specviz.train import distill

def unroll_mask(T: int, step: int, device=None) -> torch.Tensor:
    """[T, (step+1)T] bool for the queries of unroll step `step`: step-0 keys causally, then
    only the diagonal key (the same chain) of each later step (EAGLE-3's training-time test)."""
    eye = torch.eye(T, dtype=torch.bool, device=device)
    return torch.cat([torch.ones(T, T, dtype=torch.bool, device=device).tril()] + [eye] * step, 1)


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x[:, i] <- x[:, i + n] along dim 1, zero-padded at the end."""
    if n == 0:
        return x
    pad = torch.zeros_like(x[:, :n])
    return torch.cat([x[:, n:], pad], 1)


def unroll(head, batch: dict, steps: int, g0: torch.Tensor | None = None,
           inputs=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Draft `steps` tokens from every position at once, tokens teacher-forced: chain i at step
    j feeds (step j-1's output, token_{i+1+j}) at position i+j and predicts token_{i+2+j}.
    inputs(j, prev_out) -> (g, emb) overrides the step-j inputs (P-EAGLE's mask entries).
    Returns per step (out [B, T, d], logits [B, T, Vd])."""
    tokens = batch["tokens"]
    T = tokens.shape[1]
    g = head.fuse({k: batch[f"h{k}"] for k in head.taps}) if g0 is None else g0
    past, res = None, []
    for j in range(steps):
        if inputs is not None and j > 0:
            g, emb = inputs(j, res[-1][0])
        else:
            emb = head.embed(shift(tokens, 1 + j))
        pos = torch.arange(T, device=tokens.device) + j
        out, logits, kv = head(g, emb, pos, past, unroll_mask(T, j, tokens.device))
        past = cat_kv(past, kv)
        res.append((out, logits))
        g = out
    return res


def response_weight(batch: dict, offset: int) -> torch.Tensor:
    """[B, T] 1 where the label row i + offset lies in the crop and the token it predicts
    (i + offset + 1) is a response token: drafters never predict the prompt at inference, and the
    fixed system prompt would otherwise be memorised and inflate held-out scores."""
    return shift(batch["valid"] * batch["loss_mask"], offset + 1)


def soft_ce(logits: torch.Tensor, batch: dict, t2d: torch.Tensor, offset: int,
            greedy_mix: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of draft logits [B, T, Vd] at chain i against the target distribution at
    position i+offset (top-k soft labels restricted to the draft vocabulary, renormalised; with
    `greedy_mix`, mixed with the target's greedy token: distill.with_greedy).
    Returns (per-position loss [B, T], weight [B, T]: response labels inside the crop)."""
    d, p = distill.to_draft(shift(batch["topk_ids"], offset), shift(batch["topk_p"], offset).float(),
                            t2d, logits.shape[-1])
    loss = distill.soft_ce(logits.float(), d, distill.with_greedy(p, greedy_mix))
    return loss, response_weight(batch, offset) * (p.sum(-1) > 0)


def hits(logits_by_step: list[torch.Tensor], batch: dict, t2d: torch.Tensor) -> torch.Tensor:
    """[n, D] bool: whether step j's argmax is the target's argmax at position i+1+j, for the
    start positions i whose D targets all lie inside the sequence and are response tokens."""
    D = len(logits_by_step)
    tgt = batch["topk_ids"][..., 0]
    cols = [(lg.argmax(-1) == shift(t2d[tgt], 1 + j)) for j, lg in enumerate(logits_by_step)]
    h = torch.stack(cols, -1)                               # [B, T, D]
    ok = (shift(batch["valid"], D) > 0) & (response_weight(batch, 1) > 0)
    return h[ok]


class UnrolledTrainable:
    """Training shared by the EAGLE-family heads: unroll `steps` drafter steps (training-time
    test; P-EAGLE's steps are its parallel positions) with loss sum_j decay^j * step j's loss,
    by default the soft CE against the target's distribution j + 1 tokens ahead (mixed with its
    greedy token by `greedy_mix`). Subclasses may change `unrolled`, `step_loss` and
    `describe`; `evaluate` unrolls `eval_steps` steps (`steps` unless a subclass sets it)."""

    def __init__(self, head, steps: int, decay: float = 0.8, greedy_mix: float = 0.0):
        self.module, self.steps, self.decay, self.greedy_mix = head, steps, decay, greedy_mix
        self.taps = head.taps
        self.t2d = vocab_lookup(head.vocab_ids, head.vocab)

    @property
    def eval_steps(self) -> int:
        return self.steps

    def unrolled(self, batch, steps: int, generator=None):
        """The unroll's (out, logits) per step; `generator` is given in training only."""
        return unroll(self.module, batch, steps)

    def step_loss(self, j: int, out, logits, batch, t2d) -> tuple[torch.Tensor, dict]:
        """Step j's loss and its named parts (logged as `<name><j>`)."""
        ce = distill.weighted_mean(*soft_ce(logits, batch, t2d, 1 + j, self.greedy_mix))
        return ce, {"ce": ce}

    def loss(self, batch, generator):
        t2d = self.t2d.to(batch["tokens"].device)
        total, stats = 0.0, {}
        for j, (out, logits) in enumerate(self.unrolled(batch, self.steps, generator)):
            step, parts = self.step_loss(j, out, logits, batch, t2d)
            total = total + self.decay ** j * step
            stats |= {f"{name}{j}": v.detach() for name, v in parts.items()}
        return total, stats

    def evaluate(self, batch):
        return hits([lg for _, lg in self.unrolled(batch, self.eval_steps)], batch,
                    self.t2d.to(batch["tokens"].device))

    def export(self, **config):
        tensors = dict(self.module.state_dict())
        tensors["vocab_ids"] = self.module.vocab_ids.to(torch.int32)
        return tensors, {"draft_vocab": len(self.module.vocab_ids), "taps": list(self.taps)} | config
