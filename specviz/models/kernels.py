"""CPU inference kernels: linear layers with their weights prepacked once for oneDNN, and
attention that keeps grouped keys/values grouped.

Boundary: `Prepacked` computes x @ W.T (+ b) for a frozen weight through an opaque oneDNN-packed
copy made on first use; `pack_linears(model)` swaps a model's `nn.Linear` layers, in place, for
`PackedLinear`s that do so. The original weights stay (tied embeddings, drafter heads and
autograd read them): the same module tree, parameters and state dict, the same numbers up to
fp32 summation order. Only inference on CPU in fp32 takes the packed path. `use_grouped_sdpa`
switches a CPU model from transformers' sdpa attention to `grouped_sdpa` (same numbers).

Why: with stock `F.linear` on this 2-core CPU, a 135M model's forward costs 57 ms for one token
and 85-95 ms for 2-8 tokens, because the BLAS call repacks each weight matrix on every call, and
for few rows that doubles the memory traffic. Packing once makes it 39 ms for one token and 47 ms
for eight, so verifying a draft costs little more than a plain step. Where the oneDNN op is
missing or disagrees with `F.linear`, the stock path stays.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

ROWS_HINT = 8  # the packing is tuned for this many rows (a typical verify width); any count works


_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)  # looked up once: µs per call


@functools.cache
def available() -> bool:
    """The private oneDNN ops exist and agree with F.linear on a small random case."""
    if _LINEAR is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        w, b, x = torch.randn(48, 32), torch.randn(48), torch.randn(3, 32)
        y = _LINEAR(x, torch.ops.mkldnn._reorder_linear_weight(w, 3), b, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-4)


class Prepacked:
    """`F.linear(x, weight, bias)` for a frozen weight, through a copy of it packed for oneDNN
    the first time it runs on CPU in fp32 without autograd. The copy is rebuilt when the weight
    tensor changes (another tensor, or the same one written in place). With gradients, on
    another device or dtype, or without the op, it is plain F.linear."""

    def __init__(self):
        self._weight: torch.Tensor | None = None        # the tensor packed, as it was then:
        self._state = (0, -1)                           # (data pointer, version)
        self._packed: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        # fast path first: it runs ~200 times per token, so every attribute read counts
        if (weight is self._weight and x.dtype is torch.float32 and not torch.is_grad_enabled()
                and (weight.data_ptr(), weight._version) == self._state):
            return _LINEAR(x, self._packed, bias, "none", [], "")
        if (weight.device.type != "cpu" or weight.dtype != torch.float32 or x.dtype != weight.dtype
                or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                or not available()):
            return F.linear(x, weight, bias)
        state = (weight.data_ptr(), weight._version)
        if weight is not self._weight or state != self._state:
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
            self._weight, self._state = weight, state
        return _LINEAR(x, self._packed, bias, "none", [], "")


class PackedLinear(nn.Linear):
    """An nn.Linear whose forward goes through `Prepacked`: same parameters and state dict."""

    @classmethod
    def wrap(cls, lin: nn.Linear) -> "PackedLinear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight, new.bias = lin.weight, lin.bias
        new.mm = Prepacked()
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mm(x, self.weight, self.bias)


def pack_linears(model: nn.Module) -> nn.Module:
    """Swap every nn.Linear of `model` for a PackedLinear, in place; returns the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear.wrap(child))
    return model


GROUPED_SDPA = "specviz_grouped_sdpa"


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0,
                 scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except for a query of several tokens under a mask on CPU
    (a verify after a cached prefix, or a tree): there transformers copies every key/value head
    once per query head of its group before attending, which for the embedded model (3 groups)
    copied the whole KV cache twice per layer, about 5 ms of a 55 ms two-token forward at 200
    positions. Here the heads stay grouped (`enable_gqa`): the same arithmetic, no copy."""
    if (getattr(module, "num_key_value_groups", 1) == 1 or query.shape[2] == 1
            or attention_mask is None or query.device.type != "cpu"
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model: nn.Module) -> nn.Module:
    """Switch a CPU model that uses transformers' sdpa attention to `grouped_sdpa` (its masks
    stay sdpa's); any other model is left as it is. Returns the model."""
    if (getattr(model.config, "_attn_implementation", None) == "sdpa"
            and next(model.parameters()).device.type == "cpu"):
        AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
        AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
        model.set_attn_implementation(GROUPED_SDPA)
    return model
