"""Sampling is lossless, statistically; and the sampling transforms do what they say.

Boundary: `engine.verify.verify` and `engine.sampling` on small synthetic target (p) and draft
(q) distributions, no model. For each §0 rule (chain with q rows, deterministic draft, tree
recursive rejection sampling with deterministic or i.i.d. sampled siblings) the first emitted
token is drawn N times and its empirical distribution is compared with p.

Tolerance: the total variation distance must stay below TV_FACTOR (3) times the TV that sampling
noise alone gives on average, E[TV] ~ 1/2 sum_v sqrt(2 p(1-p) / (pi n)) (about 0.006 for
N = 20000 draws over 7 tokens), and the chi-square goodness-of-fit p-value must exceed P_MIN.
The power test shows that a plausible wrong rule (no residual) fails the same check by a wide
margin. Seeds are fixed, so results are reproducible.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from specviz.engine.sampling import SamplingParams, draw, probs, sample, uniform
from specviz.engine.tree import DraftTree
from specviz.engine.verify import verify

N = 20_000
TV_FACTOR = 3.0
P_MIN = 1e-3
SP = SamplingParams(temperature=1.0)

P = torch.tensor([0.35, 0.25, 0.15, 0.10, 0.08, 0.05, 0.02])
Q = torch.tensor([0.05, 0.10, 0.30, 0.25, 0.05, 0.05, 0.20])   # far from P: many rejections
P2 = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.20, 0.10, 0.10])   # the target one step later
V = len(P)


def fit(tokens: list[int], p: torch.Tensor) -> tuple[float, float]:
    """(total variation, chi-square p-value) of the empirical distribution of tokens against p."""
    n = len(tokens)
    counts = torch.zeros(len(p), dtype=torch.float64)
    for t, c in Counter(tokens).items():
        counts[t] = c
    p = p.double()
    tv = 0.5 * float((counts / n - p).abs().sum())
    support = p > 0
    if bool((counts[~support] > 0).any()):       # a token p forbids: as bad as it gets
        return tv, 0.0
    expected = n * p[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    pvalue = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                           torch.tensor(chi2 / 2, dtype=torch.float64)))
    return tv, pvalue


def tv_bound(p: torch.Tensor, n: int) -> float:
    """TV_FACTOR times the mean total variation of n exact draws from p (normal approximation)."""
    p = p.double()
    noise = 0.5 * float(torch.sqrt(2 * p * (1 - p) / (torch.pi * n)).sum())
    return TV_FACTOR * noise


def assert_matches(tokens: list[int], p: torch.Tensor) -> None:
    tv, pvalue = fit(tokens, p)
    bound = tv_bound(p, len(tokens))
    assert tv < bound and pvalue > P_MIN, \
        f"TV {tv:.4f} (bound {bound:.4f}), chi-square p-value {pvalue:.2e}"


def first_tokens(make_tree, p_rows: torch.Tensor, seed: int = 0) -> list[tuple[int, ...]]:
    """N rounds: the tokens each round emits (accepted nodes, then the target's token)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(N):
        tree = make_tree(g)
        v = verify(tree, p_rows, SP, g)
        out.append(tuple(tree.tokens[i] for i in v.path[1:]) + (v.token,))
    return out


def test_chain_draft_sampled_from_q():
    """Chain rule, q rows: x1, x2 ~ q; both emitted tokens follow the target's p."""
    rows = torch.stack([P, P2, P])

    def make(g):
        xs = [sample(Q, g), sample(Q, g)]
        return DraftTree.chain(0, xs, q=[float(Q[x]) for x in xs], q_rows=[Q, Q])

    runs = first_tokens(make, rows)
    assert_matches([r[0] for r in runs], P)
    # given the first draft was accepted, the next token follows the next row (p is the same
    # whatever x1 is in this synthetic setting)
    second = [r[1] for r in runs if len(r) >= 2]
    assert len(second) > N // 4
    assert_matches(second, P2)
    # acceptance rate of the first draft is sum(min(p, q)) (ALGORITHMS.md §0)
    alpha = float(torch.minimum(P, Q).sum())
    accepted = sum(len(r) >= 2 for r in runs) / N
    assert abs(accepted - alpha) < 0.015


def test_chain_through_draw_with_temperature_and_top_p():
    """Draft and target logits through the same transform (T = 0.7, top-p 0.9); the draft is
    drawn by sampling.draw, whose returned row is what verification uses as q."""
    sp = SamplingParams(temperature=0.7, top_p=0.9)
    target_logits = torch.log(P)
    draft_logits = torch.log(Q)
    p = probs(target_logits, sp)
    assert int((p > 0).sum()) < V                       # top-p really cut the tail

    def make(g):
        tok, qx, row = draw(draft_logits, sp, g)
        return DraftTree.chain(0, [tok], q=[qx], q_rows=[row])

    g = torch.Generator().manual_seed(1)
    toks = []
    rows = torch.stack([p, p])
    for _ in range(N):
        tree = make(g)
        v = verify(tree, rows, sp, g)
        toks.append(tree.tokens[v.path[1]] if len(v.path) > 1 else v.token)
    assert_matches(toks, p)


def test_deterministic_draft():
    """q one-hot (argmax draft): accept with p(x); on rejection sample p without x."""
    x = int(Q.argmax())
    runs = first_tokens(lambda g: DraftTree.chain(0, [x]), torch.stack([P, P2]), seed=2)
    assert_matches([r[0] for r in runs], P)
    assert abs(sum(r[0] == x for r in runs) / N - float(P[x])) < 0.015


def test_tree_deterministic_siblings():
    """EAGLE-style top-k children (q one-hot each), with a second level under the first two."""
    #          0
    #    /     |     \
    #   1:2   2:0    3:3
    #   / \     \
    # 4:1 5:4   6:2
    tree = DraftTree([6, 2, 0, 3, 1, 4, 2], [-1, 0, 0, 0, 1, 1, 2])
    rows = torch.stack([P, P2, Q, P, P, P, P])
    runs = first_tokens(lambda g: tree, rows, seed=3)
    assert_matches([r[0] for r in runs], P)
    # after node 1 (token 2) the target's row is P2; after node 2 (token 0) it is Q
    assert_matches([r[1] for r in runs if r[0] == 2], P2)
    assert_matches([r[1] for r in runs if r[0] == 0], Q)


def test_tree_sampled_siblings():
    """SpecInfer-style multi-draft: three siblings drawn i.i.d. from q (duplicates allowed),
    recursive rejection sampling with the residual after each rejection."""
    rows = torch.stack([P, P, P, P])

    def make(g):
        xs = [sample(Q, g) for _ in range(3)]
        return DraftTree([0, *xs], [-1, 0, 0, 0], q_rows=[None, Q, Q, Q])

    runs = first_tokens(make, rows, seed=4)
    assert_matches([r[0] for r in runs], P)


def no_residual(g: torch.Generator) -> int:
    """A plausible bug: accept x ~ q with min(1, p/q), but resample from p, not the residual."""
    x = sample(Q, g)
    return x if uniform(g) < min(1.0, float(P[x] / Q[x])) else sample(P, g)


def deterministic_without_zeroing(g: torch.Generator) -> int:
    """A plausible bug: deterministic draft accepted with p(x), but x stays in p on rejection."""
    x = int(Q.argmax())
    return x if uniform(g) < float(P[x]) else sample(P, g)


@pytest.mark.parametrize("wrong_rule", [no_residual, deterministic_without_zeroing])
def test_power_a_wrong_rule_is_detected(wrong_rule):
    g = torch.Generator().manual_seed(5)
    tokens = [wrong_rule(g) for _ in range(N)]
    tv, pvalue = fit(tokens, P)
    assert tv > 5 * tv_bound(P, N) and pvalue < 1e-12
    with pytest.raises(AssertionError, match="TV"):
        assert_matches(tokens, P)


def test_power_a_forbidden_token_fails_the_check():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert fit([0, 1] * 500 + [2], p)[1] == 0.0
    assert fit([0, 1] * 500, p)[1] > 0.5


# --- sampling.probs and the generator ----------------------------------------------------------

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))


def test_probs_temperature():
    for t in (0.5, 1.0, 2.0):
        got = probs(LOGITS, SamplingParams(temperature=t))
        assert torch.allclose(got, torch.softmax(LOGITS / t, -1), atol=1e-6)
        assert got.dtype == torch.float32
    # higher temperature flattens the distribution
    assert probs(LOGITS, SamplingParams(2.0))[0] < probs(LOGITS, SamplingParams(0.5))[0]


def test_probs_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 0.0, 1.0]], dtype=torch.float16)
    got = probs(logits, SamplingParams())
    assert torch.equal(got, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_probs_top_k():
    got = probs(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(got, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    assert torch.allclose(probs(LOGITS, SamplingParams(1.0, top_k=9)), probs(LOGITS, SamplingParams(1.0)))


@pytest.mark.parametrize("top_p, kept", [(0.3, 1), (0.49, 1), (0.51, 2), (0.79, 2), (0.81, 3),
                                         (0.96, 4), (1.0, 4)])
def test_probs_top_p_keeps_smallest_prefix_reaching_top_p(top_p, kept):
    got = probs(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert int((got > 0).sum()) == kept
    base = torch.tensor([0.5, 0.3, 0.15, 0.05])[:kept]
    assert torch.allclose(got[:kept], base / base.sum(), atol=1e-6)
    assert float(got.sum()) == pytest.approx(1.0)


def test_probs_top_p_batched_rows_are_independent():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    got = probs(logits, SamplingParams(temperature=1.0, top_p=0.6))
    assert (got > 0).tolist() == [[True, True, False, False], [False, False, True, True]]


def test_same_seed_same_draws():
    p = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0)), -1)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [sample(p, g) for _ in range(30)] + [uniform(g) for _ in range(5)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_draw():
    tok, qx, row = draw(LOGITS, SamplingParams(), None)
    assert (tok, qx, row) == (0, 1.0, None)
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(temperature=1.0, top_k=2)
    seen = set()
    for _ in range(50):
        tok, qx, row = draw(LOGITS, sp, g)
        assert torch.equal(row, probs(LOGITS, sp)) and qx == float(row[tok])
        seen.add(tok)
    assert seen == {0, 1}
