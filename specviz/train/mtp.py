"""Training the MTP module on the shared feature file (factory `mtp` for the CLI).

Boundary: the `Trainable` for loop.py. Training-time unrolling, as the module is used: step 1 at
crop index i combines Emb(t_{i+1}) with the target's h_i (hidden_states[30]) and predicts
t_{i+2}; step j > 1 combines Emb(t_{i+j}) (teacher-forced: the draft when it was accepted) with
the module's own step j-1 output and predicts t_{i+j+1}. Step j attends to step-1 keys causally
(indices <= i) plus only the diagonal key of each later step (EAGLE-3's training-time test),
which is exactly what the drafter's cache holds at inference. Loss Σ_j 0.8^(j-1) soft-label CE
against the target's top-64 distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.drafters.mtp import MtpModule
from specviz.drafters.layers import LayerShape, vocab_lookup
from specviz.train import init
from specviz.train.data import drafter_vocab
from specviz.train.distill import head_logits, soft_ce, to_draft, weighted_mean

STEPS = 3   # unrolled steps = the default γ


def unrolled_mask(n: int, j: int, device=None) -> torch.Tensor:
    """[n, j n] keys of step j (1-based): step-1 keys causally, then the diagonal of steps 2..j."""
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([torch.ones(n, n, dtype=torch.bool, device=device).tril()] + [eye] * (j - 1), 1)


@dataclass
class MtpTrainable:
    target: object
    module: MtpModule
    steps: int = STEPS

    def __post_init__(self):
        self.taps = (self.module.tap,)
        vocab = self.module.vocab
        self.head = self.target.lm_head.weight[vocab].detach()                 # [Vd, d]
        self.lookup = vocab_lookup(vocab, self.target.vocab).to(self.head.device)

    def unroll(self, batch: dict):
        """Per step j: (normed hidden [b, n, d], label row [n]) with n = T - 1 crop indices."""
        tok, h = batch["tokens"], batch[f"h{self.module.tap}"]
        T = tok.shape[1]
        n = T - 1
        emb = self.target.embed(tok).detach()
        idx = torch.arange(n, device=tok.device)
        keys, vals, out = [], [], []
        for j in range(1, self.steps + 1):
            e = emb[:, (idx + j).clamp(max=T - 1)]                       # Emb(t_{i+j})
            x = h[:, :n] if j == 1 else prev
            prefix = (torch.cat(keys, 2), torch.cat(vals, 2)) if keys else None
            prev, normed, (k, v) = self.module(e, x, idx + j - 1, prefix,
                                               unrolled_mask(n, j, tok.device))
            keys.append(k), vals.append(v)
            out.append((normed, idx + j))                               # row i+j predicts t_{i+j+1}
        return out

    def loss(self, batch: dict, generator: torch.Generator):
        T = batch["tokens"].shape[1]
        w_all = batch["valid"] * batch["loss_mask"]
        total, stats = 0.0, {}
        for j, (normed, row) in enumerate(self.unroll(batch), 1):
            ok = row + 1 < T
            r = row.clamp(max=T - 1)
            w = w_all[:, (row + 1).clamp(max=T - 1)] * ok
            ids, p = to_draft(batch["topk_ids"][:, r], batch["topk_p"][:, r], self.lookup, len(self.head))
            ce = soft_ce(head_logits(normed, self.head), ids, p)
            l = weighted_mean(ce, w)
            total = total + 0.8 ** (j - 1) * l
            stats[f"ce{j}"] = l
        return total, stats

    def evaluate(self, batch: dict) -> torch.Tensor:
        """hits [n, steps]: draft j (greedy) equals the target's argmax, at every crop index
        whose steps all have labels in the response."""
        T = batch["tokens"].shape[1]
        outs = self.unroll(batch)
        i = torch.arange(T - 1, device=batch["tokens"].device)
        first, last = (i + 2).clamp(max=T - 1), i + self.steps + 1     # first / last drafted token
        ok = (last < T) & (batch["valid"] * batch["loss_mask"])[:, first].bool() \
            & batch["valid"][:, last.clamp(max=T - 1)].bool()
        hits = [self.module.vocab[head_logits(normed, self.head).argmax(-1)]
                == batch["topk_ids"][:, row.clamp(max=T - 1), 0]
                for normed, row in outs]
        return torch.stack(hits, -1)[ok]

    def export(self):
        return ({k: v.detach() for k, v in self.module.state_dict().items()},
                {"tap": self.module.tap, "ffn": self.module.shape.ffn,
                 "draft_vocab": len(self.module.vocab)})

    def describe(self) -> str:
        return ("DeepSeek-V3-style MTP module: h' = M·cat(RMSNorm(Emb(t)), RMSNorm(h)) (embedding "
                "first), one transformer block, its own RMSNorm and the target's frozen LM head (its rows "
                f"for a {len(self.module.vocab)}-token draft vocabulary), on "
                f"hidden_states[{self.module.tap}]; reused autoregressively (γ = 3 by default). "
                "**Post-trained on a frozen target**: real MTP (DeepSeek-V3) is trained jointly "
                "with the model, so expect lower acceptance than native MTP. Trained with "
                f"{self.steps} unrolled steps (training-time test), loss Σ_j 0.8^(j-1) soft-label "
                "CE against the target's top-64 distribution.")


def mtp(target, args) -> MtpTrainable:
    vocab = drafter_vocab(args, target.vocab)
    module = MtpModule(LayerShape.of(target), vocab, tap=target.n_layers)
    init.mtp_module(module, target)
    return MtpTrainable(target, module)
