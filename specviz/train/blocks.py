"""Training the block drafters (DFlash, DSpark) on the shared feature file.

Boundary: the `Trainable`s the generic loop (loop.py) runs, built by the CLI's factories
`dflash_b8`, `dflash_b16` and `dspark`. One training sequence crop gives T positions of fused
target context; random anchors a (a response token follows) each get a block whose rows attend
to the context strictly before a and, bidirectionally, to their own block only (blocks are
isolated from each other, ALGORITHMS.md §5). Row k targets the token k - off after the anchor
(off = 1 for DFlash: the anchor row predicts nothing; off = 0 for DSpark), weighted
exp(-(k - off) / γ_w).

DFlash: soft-label CE against the target's distribution. DSpark: w CE + (1 - w) ‖p_d - p_t‖₁ +
BCE(c, c*) with c* = 1 - ½‖p_d - p_t‖₁ (w = 0.1 as published, `--ce-weight`) and the Markov /
confidence heads teacher-forced on the true previous token; at export, sequential calibration
(per-position temperature and bias, train/calibrate.py) on held-out sequences.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specviz.drafters.dflash import BlockBackbone
from specviz.drafters.dspark import DSparkModel
from specviz.drafters.layers import LayerShape
from specviz.train import calibrate, init
from specviz.train.data import TrainData, drafter_vocab
from specviz.train.distill import head_logits, l1_to_target, soft_ce, to_draft, weighted_mean

CE_WEIGHT = 0.1      # DSpark's published 0.1 CE + 0.9 L1
ANCHOR_EVERY = 16    # one training block per this many crop tokens (16 in a 256-token crop)
MARKOV_RANK = 128
CALIBRATION_SEQS = 400   # held-out sequences the export's calibration drafts from (evenly spaced);
                         # `train calibrate --fit-on` refits on engine runs
LAYERS = 2           # default drafter depth: with one layer every MASK row's query is the same
                     # vector (content-free), so a row cannot ask about the anchor; the second
                     # layer's queries carry content (one layer plateaued at ~15% first-draft
                     # accuracy on CPU-scale data, vs ~50% for the EAGLE heads)


def block_hidden(backbone: BlockBackbone, embed, batch: dict, anchors: torch.Tensor,
                 size: int) -> torch.Tensor:
    """anchors [b, na] -> final normed block hidden states [b, na, size, d]."""
    b, T = batch["tokens"].shape
    na = anchors.shape[1]
    dev = anchors.device
    prefix = backbone.context_kv(backbone.fuse({t: batch[f"h{t}"] for t in backbone.taps}),
                                 torch.arange(T, device=dev))
    x = backbone.block_input(embed, batch["tokens"].gather(1, anchors).flatten(), size)
    x = x.view(b, na * size, -1)
    pos = (anchors[:, :, None] + torch.arange(size, device=dev)).flatten(1)   # [b, na*size]
    mask = block_mask(anchors, batch["valid"].bool(), size)
    return backbone(x, pos, prefix, mask).view(b, na, size, -1)


def block_mask(anchors: torch.Tensor, valid: torch.Tensor, size: int) -> torch.Tensor:
    """[b, na*size, T + na*size] bool: block j's rows see valid context positions < anchor j and
    every row of block j (non-causal), nothing of other blocks."""
    na, T = anchors.shape[1], valid.shape[1]
    ctx = (torch.arange(T, device=anchors.device) < anchors[:, :, None]) & valid[:, None]
    own = torch.eye(na, dtype=torch.bool, device=anchors.device)
    own = own.repeat_interleave(size, 0).repeat_interleave(size, 1)
    return torch.cat([ctx.repeat_interleave(size, 1), own.expand(len(anchors), -1, -1)], -1)


def sample_anchors(batch: dict, n: int, generator: torch.Generator) -> torch.Tensor:
    """n anchors per crop, drawn among positions followed by a response token: [b, n]."""
    T = batch["tokens"].shape[1]
    ok = torch.zeros_like(batch["valid"])
    ok[:, 1:T - 1] = batch["valid"][:, 2:] * batch["loss_mask"][:, 2:]
    return torch.multinomial(ok + 1e-6, n, replacement=True, generator=generator)


def labels(batch: dict, anchors: torch.Tensor, size: int, off: int, gamma_w: float):
    """Label rows for every block row: (row index [b, na, size], weight [b, na, size])."""
    T = batch["tokens"].shape[1]
    k = torch.arange(size, device=anchors.device)
    row = anchors[:, :, None] + k - off                       # row t predicts token t + 1
    nxt = (row + 1).clamp(max=T - 1)
    ok = (row + 1 < T) & (k >= off)
    w = (batch["valid"] * batch["loss_mask"]).gather(1, nxt.flatten(1)).view_as(row) * ok
    return row.clamp(0, T - 1), w * torch.exp(-(k - off).clamp(min=0) / gamma_w)


def rows_of(batch: dict, key: str, row: torch.Tensor) -> torch.Tensor:
    """batch[key] [b, T, K] at row [b, na, s] -> [b, na, s, K]."""
    x = batch[key]
    idx = row.flatten(1)[..., None].expand(-1, -1, x.shape[-1])
    return x.gather(1, idx).view(*row.shape, x.shape[-1])


@dataclass
class BlockTrainable:
    """DFlash (dspark=None) or DSpark (the model's backbone is the one trained)."""
    target: object
    backbone: BlockBackbone
    size: int
    off: int
    gamma_w: float
    dspark: DSparkModel | None = None
    heldout: str | None = None        # DSpark: the feature folder its export calibrates on
    ce_weight: float = CE_WEIGHT      # DSpark: w of w CE + (1 - w) L1
    calibration: dict = field(default_factory=dict)

    def __post_init__(self):
        self.module = self.dspark if self.dspark is not None else self.backbone
        self.taps = self.backbone.taps
        self.head = self.target.lm_head.weight[self.backbone.vocab].detach()     # [Vd, d]

    def draft_labels(self, batch: dict, row: torch.Tensor):
        ids, p = rows_of(batch, "topk_ids", row), rows_of(batch, "topk_p", row)
        return to_draft(ids, p, self.backbone.lookup, len(self.backbone.vocab))

    # --- training -----------------------------------------------------------------------
    def loss(self, batch: dict, generator: torch.Generator):
        anchors = sample_anchors(batch, max(1, batch["tokens"].shape[1] // ANCHOR_EVERY), generator)
        h = block_hidden(self.backbone, self.target.embed, batch, anchors, self.size)
        row, w = labels(batch, anchors, self.size, self.off, self.gamma_w)
        ids, p = self.draft_labels(batch, row)
        U = head_logits(h, self.head)
        if self.dspark is None:
            ce = soft_ce(U, ids, p)
            return weighted_mean(ce, w), {"ce": weighted_mean(ce, w)}
        m = self.dspark
        prev = batch["tokens"].gather(1, (anchors[:, :, None] + torch.arange(
            self.size, device=anchors.device)).clamp(
            max=batch["tokens"].shape[1] - 1).flatten(1)).view_as(row)   # true x_k (k=0: anchor)
        e, bias = m.markov(prev)
        logits = U + bias
        ce = soft_ce(logits, ids, p)
        l1 = l1_to_target(torch.softmax(logits, -1), ids, p)
        c_star = (1 - 0.5 * l1).detach().clamp(0, 1)
        z = m.confidence_logit(h, e)
        bce = F.binary_cross_entropy_with_logits(z, c_star, reduction="none")
        loss = weighted_mean(self.ce_weight * ce + (1 - self.ce_weight) * l1 + bce, w)
        return loss, {"ce": weighted_mean(ce, w), "l1": weighted_mean(l1, w),
                      "bce": weighted_mean(bce, w), "c_star": weighted_mean(c_star, w)}

    # --- held-out evaluation ------------------------------------------------------------
    def free_run(self, batch: dict, stride: int = 1):
        """Draft as at inference (greedy, left to right) from every stride-th anchor whose
        whole block has labels: (hits [n, D] bool vs the target's argmax, confidence logits
        [n, D] or None)."""
        D = self.size - self.off
        hits, zs = [], []
        for i in range(batch["tokens"].shape[0]):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            last = int(one["valid"].sum()) - 1                    # last valid row
            cand = [a for a in range(1, last - D + 1, stride)
                    if one["loss_mask"][0, a + 1] > 0]
            if not cand:
                continue
            anchors = torch.tensor([cand], device=one["tokens"].device)
            h = block_hidden(self.backbone, self.target.embed, one, anchors, self.size)[0]
            row, _ = labels(one, anchors, self.size, self.off, self.gamma_w)
            best = rows_of(one, "topk_ids", row)[0, :, self.off:, 0]      # [n, D] target argmax
            U = head_logits(h[:, self.off:], self.head)                    # [n, D, Vd]
            vocab = self.backbone.vocab
            if self.dspark is None:
                hits.append(vocab[U.argmax(-1)] == best)
                continue
            prev = one["tokens"][0, anchors[0]]
            z, tok = [], []
            for k in range(D):
                e, bias = self.dspark.markov(prev)
                z.append(self.dspark.confidence_logit(h[:, k], e))
                prev = vocab[(U[:, k] + bias).argmax(-1)]
                tok.append(prev)
            hits.append(torch.stack(tok, 1) == best)
            zs.append(torch.stack(z, 1))
        if not hits:   # no anchor with a whole labelled block (a short sequence)
            return torch.zeros(0, D, dtype=torch.bool), (
                None if self.dspark is None else torch.zeros(0, D))
        return torch.cat(hits), (torch.cat(zs) if zs else None)

    def evaluate(self, batch: dict) -> torch.Tensor:
        return self.free_run(batch, stride=4)[0]

    # --- shipping -----------------------------------------------------------------------
    def calibrate(self) -> None:
        """Sequential calibration: fit on even held-out sequences, report on odd (at most
        CALIBRATION_SEQS of them, evenly spaced: one free run from every 4th anchor of each, as
        the held-out evaluation drafts; a long sequence's every anchor at once is a slow
        attention mask on a GPU)."""
        data, dev = TrainData(self.heldout, self.taps), self.head.device
        ids = data.heldout_ids[::max(1, -(-len(data.heldout_ids) // CALIBRATION_SEQS))]
        fit, test = [], []
        with torch.no_grad():
            for j, s in enumerate(ids):
                batch = {k: v[None].to(dev) for k, v in data.crop(s, 0, data.lengths[s]).items()}
                hits, z = self.free_run(batch, stride=4)
                (fit if j % 2 == 0 else test).append((hits.cpu(), z.cpu()))
        hits_f, z_f = map(torch.cat, zip(*fit))
        hits_t, z_t = map(torch.cat, zip(*test))
        temps, biases = calibrate.sequential_fit(z_f, hits_f)
        self.dspark.temperature.copy_(temps)
        self.dspark.calibration_bias.copy_(biases)
        self.calibration = {"fit": calibrate.report(z_f, hits_f, temps, biases),
                            "test": calibrate.report(z_t, hits_t, temps, biases),
                            "temperatures": [round(float(t), 3) for t in temps],
                            "biases": [round(float(b), 3) for b in biases]}

    def export(self):
        if self.dspark is not None:
            self.calibrate()
        tensors = {k: v.detach() for k, v in self.module.state_dict().items()}
        config = {"layers": len(self.backbone.layers), "taps": list(self.taps),
                  "block": self.size, "ffn": self.backbone.shape.ffn,
                  "draft_vocab": len(self.backbone.vocab)}
        if self.dspark is not None:
            config |= {"rank": self.dspark.w1.embedding_dim, "calibration": self.calibration}
        return tensors, config

    def describe(self) -> str:
        n = len(self.backbone.layers)
        if self.dspark is None:
            return (f"DFlash block drafter, block size {self.size} ({self.size - 1} drafts per "
                    f"forward), {n} layer(s), fused target layers {self.taps} with KV injection, "
                    f"frozen target embedding and LM head (its rows for a {len(self.backbone.vocab)}-token "
                    f"draft vocabulary, the most probable tokens of the training data). Trained "
                    f"with soft-label CE against "
                    f"the target's top-64 distribution, position weights exp(-(k-1)/{self.gamma_w:g}).")
        c = self.calibration
        return (f"DSpark drafter: DFlash-style backbone ({n} layer(s), block {self.size}, the "
                f"anchor also predicts: {self.size} drafts per forward), draft vocabulary and Markov "
                f"head on the {len(self.backbone.vocab)} most probable tokens of the data (rank "
                f"{self.dspark.w1.embedding_dim}), confidence head trained on c* = 1 - ½‖p_d - p_t‖₁. "
                f"Loss {self.ce_weight:g} CE + {1 - self.ce_weight:g} L1 + BCE, position weights "
                f"exp(-k/{self.gamma_w:g}).\n\n"
                f"Calibration (sequential per-position temperature and bias of a_j, greedy "
                f"acceptance labels; "
                f"fit on half the held-out sequences, reported on the other half): "
                f"ECE {c['test']['ece_before']:.4f} -> {c['test']['ece_after']:.4f}, "
                f"AUC {c['test']['auc']:.3f} (n = {c['test']['n_blocks']} blocks; on the fit half "
                f"ECE {c['fit']['ece_before']:.4f} -> {c['fit']['ece_after']:.4f}). "
                f"Temperatures T_k: {c['temperatures']}; biases b_k: {c['biases']}.")


def position_decay(args, size: int) -> float:
    """γ_w of the position weights: `--position-decay`, else the published 7 (B = 16) or 4."""
    return getattr(args, "position_decay", 0.0) or (7.0 if size >= 16 else 4.0)


def dflash(target, args, size: int) -> BlockTrainable:
    vocab = drafter_vocab(args, target.vocab)
    bb = BlockBackbone(LayerShape.of(target), vocab, target.vocab, init.depth(args, LAYERS))
    init.block_backbone(bb, target)
    return BlockTrainable(target, bb, size, off=1, gamma_w=position_decay(args, size))


def dflash_b8(target, args) -> BlockTrainable:
    return dflash(target, args, 8)


def dflash_b16(target, args) -> BlockTrainable:
    return dflash(target, args, 16)


def dspark(target, args, size: int = 16) -> BlockTrainable:
    vocab = drafter_vocab(args, target.vocab)
    model = DSparkModel(LayerShape.of(target), vocab, target.vocab, block=size,
                        n_layers=init.depth(args, LAYERS), rank=MARKOV_RANK)
    init.block_backbone(model.backbone, target)
    return BlockTrainable(target, model.backbone, size, off=0, gamma_w=position_decay(args, size),
                          dspark=model, heldout=args.data,
                          ce_weight=getattr(args, "ce_weight", None) or CE_WEIGHT)
