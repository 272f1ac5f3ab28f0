"""The packed CPU kernels and the cost model: same numbers as the stock layers, gradients
still flow, and the rate rule picks the verify budget it should."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from specviz.drafters.eagle import Eagle1Head, Eagle2Settings, EagleDrafter
from specviz.engine.cost import Acceptance, ForwardCost, best_budget, forward_cost, prefix_schedule
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree
from specviz.models import kernels
from specviz.models.kernels import PackedLinear, Prepacked, pack_linears
from specviz.models.target import Target



def test_the_pinned_torch_has_the_packed_ops():
    assert kernels.available()                          # else every layer takes the stock path


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (1, 9, 64)])
def test_packed_linear_matches_stock(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(64, 96, bias=bias)
    packed = PackedLinear.wrap(copy.deepcopy(lin))
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert torch.allclose(packed(x), lin(x), atol=1e-5, rtol=1e-5)
        assert packed.mm._packed is not None            # the packed path ran
    assert packed.state_dict().keys() == lin.state_dict().keys()


def test_packed_linear_backpropagates():
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    packed = PackedLinear.wrap(copy.deepcopy(lin))
    x = torch.randn(4, 32, requires_grad=True)
    lin(x).square().sum().backward()
    g_stock = x.grad.clone()
    x.grad = None
    packed(x).square().sum().backward()
    assert torch.allclose(x.grad, g_stock, atol=1e-6)
    assert packed.weight.grad is not None


def test_prepacked_follows_in_place_weight_changes():
    torch.manual_seed(0)
    w, x = torch.randn(40, 24), torch.randn(3, 24)
    mm = Prepacked()
    with torch.no_grad():
        first = mm(x, w)
        w.mul_(2.0)                                     # bumps the version: repacked
        assert torch.allclose(mm(x, w), 2 * first, atol=1e-5)


def test_pack_linears_keeps_ties_and_logits(tiny_target):
    model = copy.deepcopy(tiny_target.model)
    pack_linears(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert isinstance(model.model.layers[0].mlp.up_proj, nn.Linear)
    assert model.state_dict().keys() == tiny_target.model.state_dict().keys()
    packed = Target(model, tiny_target.tokenizer, "tiny-packed")
    ids = list(range(100, 140))
    ref = tiny_target.forward(ids, tiny_target.new_cache()).logits
    got = packed.forward(ids, packed.new_cache()).logits
    assert torch.allclose(ref, got, atol=1e-4)


def test_forward_cost_interpolates():
    c = ForwardCost([1, 8, 16], [0.040, 0.047, 0.060])
    assert c(1) == pytest.approx(0.040)
    assert c(8) == pytest.approx(0.047)
    assert c(12) == pytest.approx(0.0535)
    assert c(24) == pytest.approx(0.073)                 # linear beyond the last width
    with pytest.raises(ValueError):
        ForwardCost([8, 1], [0.1, 0.2])
    assert ForwardCost([1], [0.04])(16) == 0.04          # one width: flat


def test_forward_cost_measures_a_target(tiny_target):
    c = forward_cost(tiny_target)
    assert c is forward_cost(tiny_target)                # measured once per target
    assert c.widths[0] == 1 and len(c.widths) >= 4
    assert all(s > 0 for s in c.seconds) and c.seconds == sorted(c.seconds)


def test_best_budget_rule():
    values = [0.9, 0.6, 0.3, 0.05]
    flat = lambda w: 0.05                                 # noqa: E731  (a GPU: width is free)
    assert best_budget(values, 0.01, flat) == 4
    steep = lambda w: 0.04 + 0.01 * (w - 1)               # noqa: E731  (10 ms per verified node)
    # rates: n=0 1/.05=20, n=1 1.9/.06=31.7, n=2 2.5/.07=35.7, n=3 2.8/.08=35, n=4 2.85/.09=31.7
    assert best_budget(values, 0.01, steep) == 2
    assert best_budget([0.01, 0.01], 0.01, steep) == 0   # nothing pays: a plain step
    assert best_budget([], 0.01, steep) == 0


def test_eagle2_budget_is_a_prefix_of_the_full_tree(tiny_target):
    torch.manual_seed(1)
    vocab = torch.randperm(49152, generator=torch.Generator().manual_seed(0))[:1024].sort().values
    head = Eagle1Head(tiny_target, vocab).eval()
    ids = tiny_target.encode("What is the capital of France?")
    feats = tiny_target.forward(ids[:-1], tiny_target.new_cache(), taps=head.taps).taps
    settings = Eagle2Settings(top_k=4, depth=4, total_tokens=16)
    trees = {}
    for name, cost in [("full", None), ("steep", ForwardCost([1, 2], [0.01, 0.03])),
                       # width free, and a verify so slow that this machine's drafting time
                       # (measured, noisy) never decides anything
                       ("flat", ForwardCost([1, 64], [10.0, 10.0]))]:
        drafter = EagleDrafter(head, settings, cost)
        trees[name] = drafter.draft(drafter.start(ids, feats), ids[-1], SamplingParams(), None)
    full, steep, flat = trees["full"], trees["steep"], trees["flat"]
    assert len(flat) == len(full) == 16
    assert len(steep) < len(full) and "verifying the best" in steep.note
    assert set(zip(steep.tokens, steep.depths)) <= set(zip(full.tokens, full.depths))


def test_acceptance_learns_from_verified_trees():
    acc = Acceptance()
    assert acc(0.45) == pytest.approx(0.45)              # the prior: the draft's own q
    # root 0 with children 1 (q .45), 2 (q .15); node 1 has child 3 (q .45)
    parents, tokens, probs = [-1, 0, 0, 1], [7, 10, 11, 12], [None, 0.45, 0.15, 0.45]
    acc.observe(parents, tokens, probs, committed=[7, 10, 12])   # 10 then 12 accepted
    assert acc.tested[4] == 2 and acc.accepted[4] == 2
    assert acc.tested[1] == 1 and acc.accepted[1] == 0
    acc.observe(parents, tokens, probs, committed=[7])           # nothing accepted
    assert acc.tested[4] == 3 and acc.accepted[4] == 2 and acc.tested[1] == 2
    assert acc(0.45) == pytest.approx((2 + 4 * 0.45) / (3 + 4))
    assert acc(0.15) < 0.15
    # a drafter holds its tree until the verdict; settling twice learns once
    tree = DraftTree([7, 10], [-1, 0], confidence=[None, 0.45])
    assert acc.expect(tree) is tree
    acc.settle([7, 10])
    acc.settle([7, 10])
    assert acc.tested[4] == 4 and acc.accepted[4] == 3


def test_prefix_schedule_is_algorithm_1():
    flat = lambda w: 0.05                                 # noqa: E731
    assert prefix_schedule([0.9, 0.5, 0.1], flat) == 3    # free width: verify every draft
    steep = lambda w: 0.04 + 0.01 * (w - 1)               # noqa: E731
    # theta: j=0 1/.04=25, j=1 1.9/.05=38, j=2 2.4/.06=40, j=3 2.5/.07=35.7 -> 2
    assert prefix_schedule([0.9, 0.5, 0.1], steep) == 2
    # the early break: j=1 does not pay, so j=2 is never looked at, however good it would be
    bump = ForwardCost([1, 2, 3], [0.04, 0.08, 0.05])
    assert prefix_schedule([0.5, 0.5], bump) == 0
    assert prefix_schedule([], steep) == 0


def _prepacked(module: nn.Module) -> list[Prepacked]:
    return [v for m in module.modules() for v in vars(m).values() if isinstance(v, Prepacked)]


@pytest.mark.parametrize("bias", [False, True])
def test_bf16_linear_is_close_and_returns_fp32(bias):
    """Where oneDNN has a bfloat16 linear on this CPU, it is close to fp32 and returns fp32;
    where it has none (no avx512bw/vl/dq or avx_ne_convert), bf16 is refused with a message."""
    if not kernels.available("bf16"):
        with pytest.raises(ValueError, match="use precision=fp32"):
            kernels.resolve_precision("bf16", torch.device("cpu"))
        assert kernels.resolve_precision("auto", torch.device("cpu")) == "fp32"
        return
    torch.manual_seed(0)
    lin = nn.Linear(64, 96, bias=bias)
    with kernels.linear_precision("bf16"):
        packed = PackedLinear.wrap(copy.deepcopy(lin))
    assert packed.mm.bf16 and not PackedLinear.wrap(copy.deepcopy(lin)).mm.bf16
    x = torch.randn(5, 64)
    with torch.inference_mode():
        got, ref = packed(x), lin(x)
    assert got.dtype == torch.float32 and packed.mm._packed.dtype == torch.bfloat16
    assert not torch.equal(got, ref)                    # really computed in bfloat16
    assert torch.allclose(got, ref, atol=0.05, rtol=0.02)


def test_resolve_precision(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert kernels.resolve_precision("fp32", cpu) == "fp32"
    assert kernels.resolve_precision("auto", gpu) == "fp32"      # the packed kernels are CPU-only
    assert kernels.resolve_precision("auto", cpu) == ("bf16" if kernels.native_bf16() else "fp32")
    with pytest.raises(ValueError, match="precision must be one of"):
        kernels.resolve_precision("fp16", cpu)
    monkeypatch.setattr(kernels, "available", lambda precision="fp32": precision == "fp32")
    assert kernels.resolve_precision("auto", cpu) == "fp32"
    with pytest.raises(ValueError, match="use precision=fp32"):
        kernels.resolve_precision("bf16", cpu)


def test_a_bf16_linear_without_the_kernel_is_refused_not_crashed(monkeypatch):
    """Made inside linear_precision("bf16") directly (not through resolve_precision), a
    PackedLinear still refuses with the message where oneDNN has no bfloat16 linear."""
    monkeypatch.setattr(kernels, "available", lambda precision="fp32": precision == "fp32")
    lin = nn.Linear(16, 8)
    with kernels.linear_precision("bf16"):
        packed = PackedLinear.wrap(lin)
    with torch.inference_mode(), pytest.raises(ValueError, match="use precision=fp32"):
        packed(torch.randn(2, 16))
    x = torch.randn(2, 16, requires_grad=True)     # with autograd it is plain F.linear
    torch.testing.assert_close(packed(x), lin(x))


@pytest.mark.parametrize("sid", ["eagle3", "dflash"])
def test_precision_setting_reaches_the_drafter_never_the_target(target, sid):
    from specviz import strategies
    for precision in ("bf16", "fp32"):
        if precision == "bf16" and not kernels.available("bf16"):    # this CPU has no bf16 linear
            with pytest.raises(ValueError, match="use precision=fp32"):
                strategies.drafter_for(target, sid,
                                       strategies.parse_settings(sid, {"precision": precision}))
            continue
        drafter = strategies.drafter_for(target, sid,
                                         strategies.parse_settings(sid, {"precision": precision}))
        module = drafter.head if sid == "eagle3" else drafter.backbone
        mms = _prepacked(module) + ([drafter.head.mm] if sid == "dflash" else [])
        assert mms and all(mm.bf16 == (precision == "bf16") for mm in mms), precision
    assert not any(mm.bf16 for mm in _prepacked(target.model))
    with pytest.raises(ValueError, match="precision must be one of"):
        strategies.parse_settings(sid, {"precision": "half"})
