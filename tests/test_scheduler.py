"""Verify-length policies (engine/scheduler.py): Algorithm 1 on hand-computed cases (lengths,
ties, the early break), the other policies, and a statistical test that the early break is what
keeps sampling lossless.

The statistical setting is synthetic (no model): a two-draft chain over a 3-token vocabulary
whose second confidence depends on the first draft x_1 (c_2 = 1 when x_1 = 0, else 0), and an
SPS curve under which verifying x_1 alone does not pay when c_1 = 0.3 but x_1 and x_2 together
do when a_2 is high. Without the early break, x_1 is verified exactly when x_1 = 0: the first
emitted token is then biased towards 0 (P = 0.575 instead of 0.5). With it, the decision
depends on c_1 only and the emitted tokens follow p. Tolerances as in test_sampling_stats.
"""
from __future__ import annotations

import pytest
import torch

from specviz.engine import scheduler as sch
from specviz.engine.cost import ForwardCost, prefix_schedule
from specviz.engine.sampling import SamplingParams, sample
from specviz.engine.tree import DraftTree
from specviz.engine.verify import verify
from test_sampling_stats import P_MIN, fit, tv_bound


def table(points: dict[int, float]):
    return lambda b: points[b]


def test_algorithm1_hand_computed():
    curves = [[0.9, 0.5], [0.8, 0.2]]
    sps = table({2: 10.0, 3: 9.0, 4: 8.0, 5: 6.0, 6: 5.0})
    # (0,1): 2.9*9 = 26.1 > 20; (1,1): 3.7*8 = 29.6 > 26.1; (0,2): 4.2*6 = 25.2: break
    assert sch.algorithm1(curves, sps) == [1, 1]
    d = sch.decide(sch.parse_policy("dspark"), curves, sps)
    assert d.lengths == [1, 1] and d.batch_tokens == 4 and d.sps == 8.0
    assert d.expected_tokens == pytest.approx(3.7)


def test_algorithm1_ties_take_smaller_j_first():
    # all a = 0.6: order (0,1), (1,1), (0,2); the third does not pay
    curves = [[0.6, 0.6], [0.6]]
    sps = table({2: 10.0, 3: 8.0, 4: 7.0, 5: 4.0})
    assert sch.algorithm1(curves, sps) == [1, 1]       # not [2, 0]


def test_algorithm1_early_break_stops_at_first_non_improving_entry():
    sps = table({1: 10.0, 2: 6.0, 3: 5.5})
    # j=1: 1.5*6 = 9 <= 10 stops; a global search would take j=2: 2.0*5.5 = 11 > 10
    assert sch.algorithm1([[0.5, 0.5]], sps) == [0]
    assert sch.algorithm1([[0.5, 0.5]], sps, early_break=False) == [2]
    assert sch.algorithm1([], sps) == []


def test_single_request_prefix_schedule_is_algorithm1():
    cost = ForwardCost([1, 2, 4, 8, 16], [0.040, 0.042, 0.046, 0.055, 0.075])
    for surv in ([0.9, 0.8, 0.7, 0.3, 0.1], [0.2, 0.1], [0.99] * 12, []):
        n = prefix_schedule(surv, cost)
        assert n == sch.algorithm1([surv], lambda b: 1.0 / cost(b))[0]
    assert prefix_schedule([0.99] * 12, cost) > 0 and prefix_schedule([0.01], cost) == 0


def test_fixed_and_threshold():
    curves = [[0.9, 0.5, 0.1], [0.1]]
    sps = lambda b: 1.0  # noqa: E731
    fixed = sch.decide(sch.parse_policy("fixed:2"), curves, sps)
    assert fixed.lengths == [2, 1] and fixed.batch_tokens == 5
    thr = sch.decide(sch.parse_policy("threshold:0.4"), curves, sps)
    assert thr.lengths == [2, 0]
    assert "a_3 = 0.10 < 0.4" in thr.reasons[0]


def test_dspark_prod_budget_from_two_steps_before():
    s = sch.Scheduler(sch.parse_policy("dspark-prod"))
    sps = table({b: 10.0 - b for b in range(1, 10)})
    first = [[0.9, 0.9, 0.1], [0.95, 0.1]]
    k = sum(sch.algorithm1(first, sps))
    d1 = s.decide(first, sps)
    assert d1.budget is None and d1.lengths == sch.algorithm1(first, sps)   # no history yet
    s.decide([[0.1], [0.1]], sps)
    third = [[0.5, 0.4, 0.3], [0.99, 0.98, 0.97]]
    d3 = s.decide(third, sps)
    assert d3.budget == k and sum(d3.lengths) == k
    assert d3.lengths == sch.top_k(third, k)
    assert sch.top_k(third, 4) == [1, 3]


@pytest.mark.parametrize("bad", ["fixed", "fixed:-1", "fixed:x", "threshold:2", "greedy", "dspark:1"])
def test_bad_policy_ids(bad):
    with pytest.raises(ValueError):
        sch.parse_policy(bad)


def test_policy_ids_round_trip():
    for text in ("fixed:4", "threshold:0.3", "dspark", "dspark-prod"):
        assert sch.parse_policy(text).id == text


# --- the early break keeps sampling lossless ----------------------------------------------------
SP = SamplingParams(temperature=1.0)
P1 = torch.tensor([0.5, 0.3, 0.2])          # target at the first position
Q1 = torch.tensor([0.7, 0.1, 0.2])          # draft at the first position
P2 = torch.tensor([0.2, 0.2, 0.6])
Q2 = torch.tensor([0.3, 0.3, 0.4])
SPS_CURVE = table({1: 1.0, 2: 0.75, 3: 0.65})
N = 20_000


def first_tokens(early_break: bool, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(N):
        c1 = 0.3 if float(torch.rand((), generator=g)) < 0.5 else 0.9   # known before x_1
        x1 = sample(Q1, g)
        c2 = 1.0 if x1 == 0 else 0.0                                   # depends on x_1
        x2 = sample(Q2, g)
        n = sch.algorithm1([[c1, c1 * c2]], SPS_CURVE, early_break)[0]
        tree = DraftTree.chain(99, [x1, x2][:n], q=[float(Q1[x1]), float(Q2[x2])][:n],
                               q_rows=[Q1, Q2][:n])
        v = verify(tree, torch.stack([P1, P2, P2][:n + 1]), SP, g)
        out.append(tree.tokens[v.path[1]] if len(v.path) > 1 else v.token)
    return out


def test_early_break_keeps_the_first_token_distribution():
    tv, pvalue = fit(first_tokens(True, 1), P1)
    assert tv < tv_bound(P1, N) and pvalue > P_MIN


def test_without_early_break_the_distribution_is_biased():
    tokens = first_tokens(False, 1)
    tv, pvalue = fit(tokens, P1)
    assert tokens.count(0) / N == pytest.approx(0.575, abs=0.02)
    assert tv > 5 * tv_bound(P1, N) and pvalue < 1e-12


class Lazy:
    """A lazy curve that logs which a_j were asked for."""

    def __init__(self, values, log, r):
        self.values, self.log, self.r = values, log, r

    def a(self, j):
        self.log.append((self.r, j))
        return self.values[j - 1] if j <= len(self.values) else None


def test_lazy_curves_give_the_same_decisions_and_ask_only_what_may_be_verified():
    curves = [[0.9, 0.8, 0.3, 0.2], [0.95, 0.5, 0.4], [0.1]]
    sps = table({b: 20.0 - b for b in range(1, 20)})
    for pid in ("fixed:2", "threshold:0.45", "dspark"):
        log: list = []
        lazy = [Lazy(c, log, r) for r, c in enumerate(curves)]
        want = sch.decide(sch.parse_policy(pid), curves, sps)
        got = sch.decide(sch.parse_policy(pid), lazy, sps)
        assert got.lengths == want.lengths and got.expected_tokens == pytest.approx(want.expected_tokens)
        for r, n in enumerate(got.lengths):   # a_{j} asked only once draft j-1 was taken
            asked = max(j for rr, j in log if rr == r)
            assert asked <= n + 1
            assert got.curves[r] == curves[r][:len(got.curves[r])]
