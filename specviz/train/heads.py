"""Training the EAGLE-family feature heads: EAGLE-1 (also EAGLE-2's weights), EAGLE-3 and
P-EAGLE (the heads and their drafting: drafters/eagle.py, eagle3.py, peagle.py).

Boundary: the `Trainable`s the generic loop (loop.py) runs, built by the CLI's factories
`eagle1`, `eagle3` and `peagle`. EAGLE-1: SmoothL1(f̂, f) + 0.1 * soft CE, uniform noise on the
input features. EAGLE-3 and P-EAGLE: `unroll.UnrolledTrainable` (sum_j 0.8^j * soft CE over
unrolled steps; P-EAGLE's steps are its parallel mask positions).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specviz.drafters.eagle import Eagle1Head
from specviz.drafters.eagle3 import Eagle3Head
from specviz.drafters.peagle import LAYERS as PEAGLE_LAYERS, PEagleHead
from specviz.train import init
from specviz.train.data import drafter_vocab
from specviz.train.distill import weighted_mean
from specviz.train.unroll import UnrolledTrainable, shift, soft_ce, unroll


class Eagle1Trainable(UnrolledTrainable):
    """EAGLE-1's loss, optionally over `steps` unrolled steps (HASS's harmonized context
    alignment): step j feeds the head's own step j-1 feature, as the tree's deeper levels do at
    inference, and is weighted decay^j. One step is the published EAGLE-1 recipe."""
    eval_steps = 5

    def __init__(self, head: Eagle1Head, noise: float = 0.2, steps: int = 1, decay: float = 0.8):
        super().__init__(head, steps, decay)
        self.noise = noise

    def unrolled(self, batch, steps, generator=None):
        if generator is None:
            return unroll(self.module, batch, steps)
        f = batch[f"h{self.taps[0]}"]
        noise = (torch.rand(f.shape, generator=generator, device=f.device) - 0.5) * self.noise
        return unroll(self.module, batch, steps, g0=f + noise)

    def step_loss(self, j, out, logits, batch, t2d):
        ce, w = soft_ce(logits, batch, t2d, 1 + j)
        target = shift(batch[f"h{self.taps[0]}"], 1 + j)
        reg = F.smooth_l1_loss(out, target, reduction="none").mean(-1)
        reg, ce = weighted_mean(reg, w), weighted_mean(ce, w)
        return reg + 0.1 * ce, {"reg": reg, "ce": ce}

    def describe(self) -> str:
        return ("EAGLE-1 feature head: fc Linear(2d -> d, bias) on cat(emb(t_{i+1}), f_i) with "
                "f = target hidden_states[30], one Llama decoder layer (d 576, 9/3 heads, MLP "
                "1536), output = predicted next feature; logits from the target's frozen LM head "
                f"restricted to a {len(self.module.vocab_ids)}-token draft vocabulary (most "
                "target probability mass in the data). Loss SmoothL1(f̂, f) + 0.1 * soft CE "
                "(top-64 target probabilities), uniform input noise ±0.1" +
                (f", summed {self.decay:g}^j over {self.steps} unrolled steps that feed the head "
                 "its own features (HASS's harmonized context alignment)" if self.steps > 1
                 else "") +
                ". Strategies: `eagle1` (static 20-node tree), `eagle2` (EAGLE-2 dynamic tree, "
                "same weights).")


def eagle1(target, args) -> Eagle1Trainable:
    return Eagle1Trainable(Eagle1Head(target, drafter_vocab(args, target.vocab)),
                           steps=getattr(args, "ttt_steps", 0) or 1)


TTT_STEPS = 4       # EAGLE-3's training-time test: unrolled steps (`--ttt-steps` overrides)


class Eagle3Trainable(UnrolledTrainable):
    def __init__(self, head: Eagle3Head, steps: int = TTT_STEPS, decay: float = 0.8,
                 greedy_mix: float = 0.0):
        super().__init__(head, steps, decay, greedy_mix)

    def describe(self) -> str:
        return (f"EAGLE-3 head: fc Linear(3d -> d) on target hidden_states {list(self.taps)}; one "
                "Llama decoder layer whose attention reads cat(RMSNorm(emb), RMSNorm(g)) (2d) "
                "with residual g; RMSNorm + the target's LM-head rows of a "
                f"{len(self.module.vocab_ids)}-token draft vocabulary (frozen, `vocab_ids` = d2t "
                f"as ids). Training-time test: {self.steps} unrolled steps, loss sum "
                f"{self.decay:g}^j soft "
                "CE" + (f" against labels mixed {self.greedy_mix:g} with the target's greedy "
                        "token" if self.greedy_mix else "") +
                ". Strategy `eagle3`: EAGLE-2 dynamic tree (default) or chain (mode=chain).")


def eagle3(target, args) -> Eagle3Trainable:
    return Eagle3Trainable(Eagle3Head(target, drafter_vocab(args, target.vocab)),
                           steps=getattr(args, "ttt_steps", 0) or TTT_STEPS,
                           greedy_mix=getattr(args, "greedy_mix", 0.0))


class PEagleTrainable(UnrolledTrainable):
    def __init__(self, head: PEagleHead, k: int = 4, decay: float = 0.8):
        super().__init__(head, k, decay)

    def unrolled(self, batch, steps, generator=None):
        return unroll(self.module, batch, steps,
                      inputs=lambda j, prev: self.module.mask_inputs(prev.shape))

    def export(self):
        return super().export(layers=self.module.n_layers, ffn=self.module.ffn, k=self.steps)

    def describe(self) -> str:
        m = self.module
        return (f"P-EAGLE head: fc Linear(3d -> d) on target hidden_states {list(self.taps)}, "
                f"fc_in Linear(2d -> d) on cat(emb, g), {m.n_layers} Llama decoder layers (MLP "
                f"{m.ffn}), learned shared hidden state and mask-token embedding for the parallel "
                f"positions; RMSNorm + the target's frozen LM-head rows of a "
                f"{len(m.vocab_ids)}-token draft vocabulary. One forward proposes K = {self.steps} "
                f"tokens; loss sum {self.decay:g}^k soft CE over the K positions.")


def peagle(target, args) -> PEagleTrainable:
    return PEagleTrainable(PEagleHead(target, drafter_vocab(args, target.vocab),
                                      init.depth(args, PEAGLE_LAYERS)))
