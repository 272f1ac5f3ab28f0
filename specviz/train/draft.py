"""Training the separate draft model (drafters/draft.py): distillation against the target.

Boundary: the `Trainable` the generic loop (loop.py) runs, built by the CLI's factory `draft`:
soft CE against the target's top-64 distribution on the draft vocabulary, layers started from
target layers (`init.draft_model`); only the layers and the final norm are exported.
"""
from __future__ import annotations

import torch

from specviz.drafters.draft import DraftModel
from specviz.drafters.layers import vocab_lookup
from specviz.train import init
from specviz.train.data import drafter_vocab
from specviz.train.distill import weighted_mean
from specviz.train.unroll import hits, shift, soft_ce


class DraftTrainable:
    taps: tuple[int, ...] = ()
    eval_steps = 5

    def __init__(self, model: DraftModel):
        self.module = model
        self.export_root = model.lm          # `export` writes its state dict's keys
        self.t2d = vocab_lookup(model.vocab_ids, model.vocab)

    def loss(self, batch, generator):
        logits = self.module(batch["tokens"])
        ce = weighted_mean(*soft_ce(logits, batch, self.t2d.to(logits.device), 0))
        return ce, {"ce": ce}

    def evaluate(self, batch):
        logits = self.module(batch["tokens"])      # teacher-forced chain: step j = row i+1+j
        return hits([shift(logits, 1 + j) for j in range(self.eval_steps)], batch,
                       self.t2d.to(logits.device))

    def export(self):
        tensors = dict(self.module.shipped())
        tensors["vocab_ids"] = self.module.vocab_ids.to(torch.int32)
        return tensors, {"draft_vocab": len(self.module.vocab_ids),
                         "layers": len(self.module.lm.model.layers),
                         "source_layers": self.module.source_layers}

    def describe(self) -> str:
        n = len(self.module.lm.model.layers)
        return (f"Draft LM: LlamaForCausalLM with the target's shapes and {n} layers (a fresh run "
                f"starts them as copies of target layers {self.module.source_layers}; layers that "
                "`--layers` adds to shipped weights start as the identity), the target's frozen "
                "embedding and tied LM head (not shipped). Distilled with "
                "soft CE against the target's top-64 distribution on a "
                f"{len(self.module.vocab_ids)}-token draft vocabulary, which our drafter also "
                "uses for speed; `load_draft_lm` gives the full-vocabulary model for HF "
                "assisted generation.")


def draft(target, args) -> DraftTrainable:
    model = DraftModel(target, drafter_vocab(args, target.vocab), init.depth(args, 2))
    return DraftTrainable(init.draft_model(model, target))
