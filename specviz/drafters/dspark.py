"""DSpark: a DFlash backbone whose anchor is also a prediction position, plus a Markov head, a
calibrated confidence head and confidence-prefix truncation (ALGORITHMS.md §6).

Boundary: the heads and the single-request drafting policy. Block row k (k = 0..γ-1, the anchor
is row 0) drafts x_{k+1}:
  p_k = softmax(U_k + B(x_k)),  B(x) = W2 · W1[x]    (U_k: backbone logits over the draft
                                                       vocabulary; W1 rows for its tokens + one
                                                       "other" row; W2 -> a bias per draft token)
  c_k = σ((wᵀ[h_k ; W1[x_k]] + b) / T_k + β_k)      (confidence that x_{k+1} is accepted given
                                                       all earlier drafts were; T_k and β_k
                                                       fitted in order of k, train/calibrate.py)
  a_k = Π_{i<=k} c_i                                   (prefix survival)
with x_0 the anchor and x_k the previous draft, sampled left to right. c_k depends on x_{<=k}
only, so cutting the chain at the first a_k < threshold decides whether to verify x_{k+1}
before x_{k+1} is looked at (non-anticipation, ALGORITHMS.md §0). Under greedy decoding the
default cut is the paper's hardware-aware prefix scheduler instead (`cost.prefix_schedule`, on
the measured forward cost), and drafting stops at the first draft it would not verify (the
Markov head is the sequential part of a step, so the drafts after the cut are never drawn);
sampling keeps the threshold and draws the whole block, so that a seed fixes the output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from specviz.drafters import block_tree, weights
from specviz.drafters.base import DrafterUnavailable
from specviz.drafters.dflash import TAPS, BlockBackbone, ContextCache, ContextState
from specviz.drafters.layers import DraftHead, LayerShape
from specviz.engine.cost import ForwardCost, forward_cost, prefix_schedule
from specviz.engine.sampling import SamplingParams, draw
from specviz.engine.tree import DraftTree, Schedule
from specviz.models.kernels import pack_linears


class DSparkModel(nn.Module):
    """Backbone + Markov head + confidence head (+ per-position calibration: c_k = σ(z_k / T_k +
    b_k), train/calibrate.py). The
    Markov head lives on the backbone's draft vocabulary: W1 has a row per draft token plus one
    "other" row, W2 maps to draft-vocabulary logits."""

    # weights whose rows follow the draft vocabulary, and what a token new to it starts from
    # (train/init.py revocab): W1's "other" row (the one it used while outside), W2 zero rows
    VOCAB_ROWS = {"w1.weight": "other", "w2.weight": "zero"}

    def __init__(self, shape: LayerShape, vocab: torch.Tensor, n_target_vocab: int,
                 block: int = 16, n_layers: int = 1, rank: int = 128, taps: tuple[int, ...] = TAPS):
        super().__init__()
        self.backbone = BlockBackbone(shape, vocab, n_target_vocab, n_layers, taps)
        self.block = block
        self.w1 = nn.Embedding(len(vocab) + 1, rank)
        self.w2 = nn.Linear(rank, len(vocab), bias=False)
        nn.init.zeros_(self.w2.weight)                                    # starts as the backbone
        self.conf = nn.Linear(shape.d + rank, 1)
        self.register_buffer("temperature", torch.ones(block))
        self.register_buffer("calibration_bias", torch.zeros(block))

    def markov(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """prev target ids [...] -> (W1 row [..., r], bias B = W2 W1[prev] [..., Vd])."""
        e = self.w1(self.backbone.lookup[prev])
        return e, self.w2(e)

    def confidence_logit(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Uncalibrated confidence logit wᵀ[h ; W1[x_prev]] + b: [...]."""
        return self.conf(torch.cat([h, e.to(h.dtype)], -1))[..., 0]

    def confidence(self, h: torch.Tensor, e: torch.Tensor, k: int) -> torch.Tensor:
        """Calibrated c_k for block position k: σ(z / T_k + b_k)."""
        z = self.confidence_logit(h, e)
        return torch.sigmoid(z / self.temperature[k] + self.calibration_bias[k])


ID = "dspark"


@dataclass(frozen=True)
class DSparkSettings:
    block_size: int = 16       # block inputs = drafts (at most the trained block, 16)
    # cut the chain at the first prefix survival a_k below this; 0.2 because the shipped
    # (CPU-scale) confidence head keeps a_1 at or below ~0.4, so 0.5 would never draft
    threshold: float = 0.2
    scheduler: str = "hardware"  # greedy: Algorithm 1 on the measured cost; else the threshold
    markov: bool = True        # ablation switch: backbone logits alone when False
    window: int = 0            # attend to only the last W context positions (0 = all)
    tree: int = 0              # draft a tree of this many nodes from the block (0 = the chain)
    path: str = ""            # a published drafter folder or hub id (drafters/published)
    precision: str = "auto"     # CPU linear layers: auto (bf16 where native), fp32 or bf16

    def check(self) -> None:
        if not 1 <= self.block_size <= 16:
            raise ValueError("dspark block_size must be in 1..16 (the trained block is 16)")
        if self.scheduler not in ("hardware", "threshold"):
            raise ValueError("dspark scheduler must be hardware or threshold")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError("dspark threshold must be in [0, 1) (0 = never truncate)")
        if self.window < 0:
            raise ValueError("window must be >= 0 (0 = the whole context)")
        block_tree.check_tree(self.tree)


class BlockCursor:
    """One request's block, drafted left to right on demand. `a(j)` is the prefix survival a_j:
    it draws x_1..x_{j-1} first, never x_j (non-anticipation). `draw(n)` draws up to x_n. A
    scheduler that asks for a_j only while it may still verify x_j stops the sequential Markov
    head at the first draft it would not verify (the batch engine does, engine/batch.py).
    Drafts past `limit` do not exist for it."""

    def __init__(self, drafter: "DSparkDrafter", state: ContextState, root: int,
                 sp: SamplingParams, generator: torch.Generator | None, limit: int = 16):
        self.drafter, self.root, self.sp, self.generator = drafter, root, sp, generator
        size = drafter.settings.block_size
        self.limit = min(limit, size)
        self.h = drafter.block_hidden(state, drafter.target.embed, root, size)         # [γ, d]
        with torch.inference_mode():
            self.U = drafter.head.logits(self.h)                                   # [γ, Vd]
        self.toks, self.qs, self.rows, self.conf, self.surv = [], [], [], [], []
        self._bias: torch.Tensor | None = None

    @torch.inference_mode()
    def _confide(self) -> None:
        """c_{k+1} and a_{k+1} from h_k and x_k (k = drafts so far; x_0 = the root)."""
        m, k = self.drafter.model, len(self.toks)
        e, self._bias = m.markov(torch.tensor(self.toks[-1] if self.toks else self.root,
                                              device=self.h.device))
        c = float(m.confidence(self.h[k], e, k))
        self.conf.append(c)
        self.surv.append(c * (self.surv[-1] if self.surv else 1.0))

    @torch.inference_mode()
    def _draw(self) -> None:
        k = len(self.toks)
        logits = self.U[k] + self._bias if self.drafter.settings.markov else self.U[k]
        if self.sp.greedy:      # no widened row
            tok, q, q_row = int(self.drafter.head.argmax(logits)), 1.0, None
        else:
            tok, q, q_row = draw(self.drafter.head.full(logits), self.sp, self.generator)
        self.toks.append(tok), self.qs.append(q), self.rows.append(q_row)

    def a(self, j: int) -> float | None:
        if j > self.limit:
            return None
        while len(self.surv) < j:
            if len(self.toks) < len(self.surv):
                self._draw()
            self._confide()
        return self.surv[j - 1]

    def draw(self, n: int) -> None:
        while len(self.toks) < min(n, self.limit):
            if len(self.surv) == len(self.toks):
                self._confide()
            self._draw()

    def chain(self, n: int) -> DraftTree:
        """The first n drafts as a chain (drawn now if they were not yet)."""
        self.draw(n)
        return DraftTree.chain(self.root, self.toks[:n], q=self.qs[:n], q_rows=self.rows[:n],
                               confidence=self.conf[:n], note="one block forward + Markov head, "
                               "drafted as far as the batch scheduler asked")


class DSparkDrafter(ContextCache):
    def __init__(self, target, model: DSparkModel, settings: DSparkSettings,
                 cost: ForwardCost | None = None):
        super().__init__(model.backbone, settings.window)
        self.target, self.model, self.settings, self.cost = target, model, settings, cost
        self.head = DraftHead(target, model.backbone.vocab)

    def cursor(self, state: ContextState, root: int, sp: SamplingParams,
               generator: torch.Generator | None, limit: int = 16) -> BlockCursor:
        return BlockCursor(self, state, root, sp, generator, limit)

    def draft(self, state: ContextState, root: int, sp: SamplingParams,
              generator: torch.Generator | None) -> DraftTree:
        pol = self.settings
        if pol.tree:
            return self.draft_tree(state, root, sp)
        cur = self.cursor(state, root, sp, generator)
        cut = pol.block_size
        hardware = self.cost is not None and sp.greedy
        for k in range(pol.block_size):
            a = cur.a(k + 1)
            if hardware and prefix_schedule(cur.surv, self.cost) < len(cur.surv):
                break          # Algorithm 1 stops at this draft: the rest are never drawn
            if a < pol.threshold and cut == pol.block_size:
                cut = k        # decided from x_{<=k} only: x_{k+1} is not drawn yet
            cur.draw(k + 1)
        toks, conf, surv = cur.toks, cur.conf, cur.surv
        threshold: float | None = pol.threshold
        if hardware:
            cut, threshold = len(toks), None
            reason = (f"hardware-aware scheduler: best (1 + a_1 + .. + a_j) x verify steps/s; "
                      f"{1000 * self.cost(1 + cut):.0f} ms for {1 + cut} tokens"
                      + (f"; a_{cut + 1} does not pay, so drafting stopped there"
                         if cut < pol.block_size else ""))
        else:
            reason = (f"a_{cut + 1} = {surv[cut]:.2f} < threshold {pol.threshold:.2f}"
                      if cut < pol.block_size
                      else f"all {pol.block_size} drafts clear threshold {pol.threshold:.2f}")
        return DraftTree.chain(
            root, toks, q=cur.qs, q_rows=cur.rows, confidence=conf[:len(toks)],
            schedule=Schedule(conf, surv, cut, reason, threshold),
            note=f"one block forward + {'Markov' if pol.markov else 'no Markov'} head; "
                 f"verify {cut} of {pol.block_size}")

    def draft_tree(self, state: ContextState, root: int, sp: SamplingParams) -> DraftTree:
        """`tree` nodes over the block (drafters/block_tree.py): a node's children are the top
        tokens of the next position's p_k = softmax(U_k + B(parent token)), so unlike DFlash's
        they depend on the branch. The confidence head and its schedule are not used: the budget
        is the tree's (with the hardware scheduler's cost model, under greedy decoding, the
        ranked nodes worth their verify time)."""
        t0, pol = time.perf_counter(), self.settings
        h = self.block_hidden(state, self.target.embed, root, pol.block_size)
        with torch.inference_mode():
            U = self.head.logits(h).float()                                    # [γ, Vd]
        vocab = self.head.vocab

        @torch.inference_mode()
        def markov_children(depth: int, parent: int | None) -> tuple[list[float], list[int]]:
            prev = root if parent is None else vocab[parent]
            bias = self.model.markov(torch.as_tensor(prev, device=U.device))[1].float()
            v, ix = torch.log_softmax(U[depth - 1] + bias, -1).topk(min(pol.tree, U.shape[-1]))
            return v.tolist(), ix.tolist()

        children = (markov_children if pol.markov
                    else block_tree.per_position(torch.log_softmax(U, -1), pol.tree))
        return block_tree.draft_tree(
            root, children, pol.tree, pol.block_size, vocab, state.acceptance, self.cost,
            time.perf_counter() - t0, sp.greedy,
            f"one block forward + {'Markov' if pol.markov else 'no Markov'} head, a tree over "
            f"its {pol.block_size} positions")


def load_weights(target) -> tuple[dict[str, torch.Tensor], dict]:
    """The shipped tensors and config; weights calibrated before per-position biases existed
    (temperatures only) get a zero bias."""
    tensors, cfg = weights.load(ID, target.fingerprint)
    tensors.setdefault("calibration_bias", torch.zeros(cfg["block"]))
    return tensors, cfg


def build_dspark(target, settings: DSparkSettings) -> DSparkDrafter:
    tensors, cfg = load_weights(target)
    model = DSparkModel(LayerShape.of(target, ffn=cfg["ffn"]), tensors["backbone.vocab"],
                        target.vocab, block=cfg["block"], n_layers=cfg["layers"],
                        rank=cfg["rank"], taps=tuple(cfg["taps"]))
    model.load_state_dict(tensors)
    if settings.block_size > model.block:
        raise DrafterUnavailable(f"dspark was trained with blocks of {model.block}; "
                                 f"choose block_size <= {model.block}")
    cost = forward_cost(target) if settings.scheduler == "hardware" else None
    return DSparkDrafter(target, pack_linears(model.to(target.device, target.dtype).eval()),
                         settings, cost)
