"""CPU inference kernels: linear layers with their weights prepacked once for oneDNN, and
attention that keeps grouped keys/values grouped.

Boundary: `Prepacked` computes x @ W.T (+ b) for a frozen weight through an opaque oneDNN-packed
copy made on first use; `pack_linears(model)` swaps a model's `nn.Linear` layers, in place, for
`PackedLinear`s that do so. The original weights stay (tied embeddings, drafter heads and
autograd read them): the same module tree, parameters and state dict, the same numbers up to
fp32 summation order. Only inference on CPU in fp32 takes the packed path. `use_grouped_sdpa`
switches a CPU model from transformers' sdpa attention to `grouped_sdpa` (same numbers).

Precision: a `Prepacked` made inside `linear_precision("bf16")` keeps a bfloat16 packed copy and
computes in bfloat16 (fp32 in and out): drafters are built that way on CPUs with native bfloat16
matrix units (AMX or AVX512-BF16), where it halves the weight traffic that bounds a drafter's
forward. A draft only proposes tokens, so its precision changes how many are accepted, never
which tokens the target emits; the target's own layers are built outside it and stay fp32.

Why: with stock `F.linear` on this 2-core CPU, a 135M model's forward costs 57 ms for one token
and 85-95 ms for 2-8 tokens, because the BLAS call repacks each weight matrix on every call, and
for few rows that doubles the memory traffic. Packing once makes it 39 ms for one token and 47 ms
for eight, so verifying a draft costs little more than a plain step. Where the oneDNN op is
missing or disagrees with `F.linear`, the stock path stays.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

ROWS_HINT = 8  # the packing is tuned for this many rows (a typical verify width); any count works


_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)  # looked up once: µs per call
PRECISIONS = ("auto", "fp32", "bf16")
_BF16 = contextvars.ContextVar("specviz_bf16_linears", default=False)
NO_BF16 = ("precision=bf16 needs oneDNN's bfloat16 linear, which this CPU or torch build lacks; "
           "use precision=fp32")


@functools.cache
def available(precision: str = "fp32") -> bool:
    """The private oneDNN ops exist and agree with F.linear on a small random case, computing
    in fp32 or (precision "bf16") in bfloat16, to bfloat16's accuracy."""
    if _LINEAR is None or not torch.backends.mkldnn.is_available():
        return False
    dtype, tol = (torch.bfloat16, 5e-2) if precision == "bf16" else (torch.float32, 1e-4)
    try:
        w, b, x = torch.randn(48, 32), torch.randn(48), torch.randn(3, 32)
        y = _LINEAR(x.to(dtype), torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), 3),
                    b.to(dtype), "none", [], "").float()
    except (AttributeError, RuntimeError):
        return False
    return torch.allclose(y, F.linear(x, w, b), rtol=tol, atol=tol * 8)


def native_bf16() -> bool:
    """This CPU multiplies bfloat16 matrices in hardware (AMX tiles or AVX512-BF16)."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, p, lambda: False)() for p in probes)


def check_precision(precision: str) -> None:
    """Raise ValueError unless `precision` is one of PRECISIONS."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def resolve_precision(precision: str, device: torch.device) -> str:
    """A drafter's `precision` setting -> "fp32" or "bf16" for its linear layers on `device`:
    "auto" is bf16 on a CPU with native bfloat16 (`native_bf16`), else fp32. Off the CPU the
    packed kernels are not used, so the drafter runs in its own dtype whatever this says."""
    check_precision(precision)
    if device.type != "cpu":
        return "fp32" if precision == "auto" else precision
    if precision == "bf16" and not available("bf16"):
        raise ValueError(NO_BF16)
    if precision == "auto":
        return "bf16" if native_bf16() and available("bf16") else "fp32"
    return precision


@contextlib.contextmanager
def linear_precision(precision: str):
    """Every `Prepacked` (and so every `pack_linears` layer) made inside computes in this
    precision ("fp32" or "bf16")."""
    token = _BF16.set(precision == "bf16")
    try:
        yield
    finally:
        _BF16.reset(token)


class Prepacked:
    """`F.linear(x, weight, bias)` for a frozen weight, through a copy of it packed for oneDNN
    the first time it runs on CPU in fp32 without autograd. The copy is rebuilt when the weight
    tensor changes (another tensor, or the same one written in place). With gradients, on
    another device or dtype, or without the op, it is plain F.linear. One made inside
    `linear_precision("bf16")` packs a bfloat16 copy (and bias) and computes in bfloat16; where
    oneDNN has no bfloat16 linear, packing it raises ValueError (NO_BF16)."""

    def __init__(self):
        self.bf16 = _BF16.get()
        self._bias: torch.Tensor | None = None          # the bias as packed (bf16 copy if bf16)
        self._weight: torch.Tensor | None = None        # the tensor packed, as it was then:
        self._state = (0, -1)                           # (data pointer, version)
        self._packed: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        # fast path first: it runs ~200 times per token, so every attribute read counts
        if (weight is self._weight and x.dtype is torch.float32 and not torch.is_grad_enabled()
                and (weight.data_ptr(), weight._version) == self._state):
            return self._packed_linear(x, bias)
        if (weight.device.type != "cpu" or weight.dtype != torch.float32 or x.dtype != weight.dtype
                or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                or not available()):
            return F.linear(x, weight, bias)
        state = (weight.data_ptr(), weight._version)
        if weight is not self._weight or state != self._state:
            if self.bf16 and not available("bf16"):
                raise ValueError(NO_BF16)
            dtype = torch.bfloat16 if self.bf16 else torch.float32
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype),
                                                                      ROWS_HINT)
                self._bias = None if bias is None else bias.detach().to(dtype)
            self._weight, self._state = weight, state
        return self._packed_linear(x, bias)

    def _packed_linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.bf16:     # the bias copy was taken with the weight's
            return _LINEAR(x.to(torch.bfloat16), self._packed, self._bias, "none", [], "").float()
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
