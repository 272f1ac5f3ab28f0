"""Verification with scripted-logit fakes, alone and through the full decode loop.

Boundary: `engine.verify.verify` on hand-written target rows (greedy and sampling, chain and
tree, never / always / sometimes accepts), and `engine.decode.run` driven by a scripted fake
target (the `Target` interface over a real transformers DynamicCache that stores token ids as
"keys") and a scripted drafter. Outcomes are exact: sampling cases use one-hot (or near one-hot)
target rows so every acceptance test has probability 0 or 1.
"""
from __future__ import annotations

import threading

import pytest
import torch
from transformers import DynamicCache

from specviz import events as ev
from specviz.engine import decode
from specviz.engine.decode import GenSettings
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree import DraftTree
from specviz.engine.verify import verify
from specviz.models.target import Output

V = 16
GREEDY = SamplingParams()
SAMPLE = SamplingParams(temperature=1.0)


def rows(*tokens: int) -> torch.Tensor:
    """[n, V] one-hot target rows: row i puts all mass on tokens[i]."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- verify() on a chain -----------------------------------------------------------------------

CHAIN = DraftTree.chain(0, [1, 2, 3])


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_chain_never_accepts(sp):
    v = verify(CHAIN, rows(9, 9, 9, 9), sp, gen())
    assert v.path == [0] and v.token == 9
    assert v.source == ("argmax" if sp.greedy else "residual")


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_chain_always_accepts(sp):
    v = verify(CHAIN, rows(1, 2, 3, 7), sp, gen())
    assert v.path == [0, 1, 2, 3] and v.token == 7 and v.source == "bonus"


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_chain_sometimes_accepts(sp):
    v = verify(CHAIN, rows(1, 5, 3, 7), sp, gen())
    assert v.path == [0, 1] and v.token == 5
    assert v.source == ("argmax" if sp.greedy else "residual")


def test_greedy_records_no_draws_and_sampling_records_tested_nodes():
    assert verify(CHAIN, rows(1, 5, 3, 7), GREEDY, None).draws == [None] * 4
    draws = verify(CHAIN, rows(1, 5, 3, 7), SAMPLE, gen()).draws
    assert draws[0] is None and draws[3] is None          # root and untested node
    assert all(0.0 <= d < 1.0 for d in draws[1:3])


def test_root_only():
    tree = DraftTree.root_only(4)
    v = verify(tree, rows(6), GREEDY, None)
    assert (v.path, v.token, v.source) == ([0], 6, "argmax")
    v = verify(tree, rows(6), SAMPLE, gen())
    assert (v.path, v.token, v.source) == ([0], 6, "sample")


def test_sampled_chain_with_q_rows():
    """A draft drawn from q: accept with min(1, p/q); on rejection the residual max(0, p - q)."""
    q = torch.zeros(V)
    q[[1, 4]] = 0.5
    tree = DraftTree.chain(0, [1, 2], q=[0.5, 1.0], q_rows=[q, rows(2)[0]])
    v = verify(tree, rows(1, 2, 8), SAMPLE, gen())          # p(x)/q(x) = 2 and 1: accept both
    assert (v.path, v.token, v.source) == ([0, 1, 2], 8, "bonus")
    v = verify(tree, rows(4, 2, 8), SAMPLE, gen())          # p(1) = 0: reject; residual = one-hot 4
    assert (v.path, v.token, v.source) == ([0], 4, "residual")
    p = torch.zeros(V)
    p[[1, 6]] = 0.5                                          # p(1)/q(1) = 1: always accepted
    v = verify(tree, torch.stack([p, rows(11)[0], rows(8)[0]]), SAMPLE, gen())
    assert (v.path, v.token, v.source) == ([0, 1], 11, "residual")


def test_deterministic_acceptance_follows_the_recorded_draw():
    """Deterministic child with p(x) = 0.5: accepted exactly when its uniform draw is < 0.5."""
    p = torch.zeros(V)
    p[[1, 9]] = 0.5
    tree = DraftTree.chain(0, [1])
    outcomes = set()
    for seed in range(40):
        v = verify(tree, torch.stack([p, rows(3)[0]]), SAMPLE, gen(seed))
        accepted = v.draws[1] < 0.5
        assert (v.path, v.token) == (([0, 1], 3) if accepted else ([0], 9))
        outcomes.add(accepted)
    assert outcomes == {True, False}


# --- verify() on a tree ------------------------------------------------------------------------
#        0(root)
#       /      \
#     1:5      2:6
#     /  \        \
#   3:7  4:8      5:9
TREE = DraftTree([0, 5, 6, 7, 8, 9], [-1, 0, 0, 1, 1, 2])


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_tree_never_accepts(sp):
    v = verify(TREE, rows(12, 0, 0, 0, 0, 0), sp, gen())
    assert v.path == [0] and v.token == 12
    assert v.source == ("argmax" if sp.greedy else "residual")
    if not sp.greedy:          # both siblings were tried, nothing deeper
        assert v.draws[1] is not None and v.draws[2] is not None
        assert v.draws[3:] == [None, None, None]


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_tree_accepts_second_sibling_to_a_leaf(sp):
    v = verify(TREE, rows(6, 0, 9, 0, 0, 13), sp, gen())
    assert v.path == [0, 2, 5] and v.token == 13 and v.source == "bonus"


@pytest.mark.parametrize("sp", [GREEDY, SAMPLE], ids=["greedy", "sampling"])
def test_tree_sometimes_accepts(sp):
    # first branch taken, then both grandchildren fail
    v = verify(TREE, rows(5, 14, 0, 0, 0, 0), sp, gen())
    assert v.path == [0, 1] and v.token == 14
    assert v.source == ("argmax" if sp.greedy else "residual")
    # first branch taken, second grandchild accepted
    v = verify(TREE, rows(5, 8, 0, 0, 2, 0), sp, gen())
    assert v.path == [0, 1, 4] and v.token == 2 and v.source == "bonus"


def test_tree_residual_removes_rejected_siblings():
    """Deterministic siblings 5 (p = 0.5) and 6 (p = 0): when both are rejected, the correction
    comes from what is left of p (token 10), never from a rejected sibling."""
    p = torch.zeros(V)
    p[[5, 10]] = 0.5
    seen = set()
    for seed in range(40):
        v = verify(TREE, torch.stack([p, rows(7)[0], *rows(0, 0, 0, 0)]), SAMPLE, gen(seed))
        if v.path == [0]:
            assert v.token == 10 and v.source == "residual"
        else:
            assert v.path == [0, 1, 3] and v.token == 0
        seen.add(tuple(v.path))
    assert seen == {(0,), (0, 1, 3)}


# --- the full decode loop with a scripted target and drafter -----------------------------------

def rule(context: list[int]) -> int:
    """The fake target's greedy next token: depends on the whole context, so a cache that lost
    lost, duplicated or reordered a token changes the output."""
    return (sum((i + 1) * t for i, t in enumerate(context)) * 5 + 3 * len(context)) % V


def reference(prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(rule(ctx))
    return ctx[len(prompt):]


class FakeTarget:
    """The `Target` interface decode.py uses. The cache is a real DynamicCache whose single layer
    stores token ids as keys, so Target.keep / crop / cache_len run their real code; logits are
    one-hot-ish (margin 40) on rule(context of the node)."""

    model_id = "fake"
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, eos: int | None = None, max_len: int = 512):
        self.eos_ids = {eos} if eos is not None else set()
        self.max_len = max_len
        self.calls: list[tuple[list[int], list[int]]] = []   # (cached tokens, new tokens)

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    @staticmethod
    def cached(cache: DynamicCache) -> list[int]:
        if not cache.layers or cache.layers[0].keys is None:
            return []
        return [int(x) for x in cache.layers[0].keys.flatten().tolist()]

    def forward(self, tokens, cache, parents=None, taps=(), logits_for="all") -> Output:
        past = self.cached(cache)
        self.calls.append((past, list(tokens)))
        parents = parents if parents is not None else list(range(-1, len(tokens) - 1))
        logits = torch.zeros(len(tokens), V)
        for i in range(len(tokens)):
            path, j = [], i
            while j >= 0:
                path.append(tokens[j])
                j = parents[j]
            logits[i, rule(past + path[::-1])] = 40.0
        kv = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
        cache.update(kv, kv.clone(), 0)
        n = len(tokens) if logits_for == "all" else 1 if logits_for == "last" else logits_for
        return Output(logits[len(tokens) - n:], {})

    def piece(self, token: int) -> str:
        return f"<{token}>"

    def pieces(self, tokens):
        return [self.piece(t) for t in tokens]

    def decode(self, tokens):
        return "".join(self.pieces(tokens))


class ScriptedDrafter:
    """Drafts the oracle continuation of its own view of the context, spoiled where the script
    says: script[step] is the depth of the first wrong token (None: all right). With `tree`, a
    wrong first sibling precedes the right one at depth 1."""

    taps = ()

    def __init__(self, k: int, script: list[int | None], tree: bool = False):
        self.k, self.script, self.tree = k, script, tree
        self.commits: list[list[int]] = []

    def start(self, prompt_ids, feats):
        return {"tokens": list(prompt_ids[:-1]), "step": 0}

    def draft(self, state, root, sp, generator) -> DraftTree:
        ctx = state["tokens"] + [root]
        good = reference(ctx, self.k)
        bad_at = self.script[state["step"] % len(self.script)]
        state["step"] += 1
        chain = [(t + 1) % V if d == bad_at else t for d, t in enumerate(good, 1)]
        if not self.tree:
            return DraftTree.chain(root, chain)
        # root -> [wrong sibling, chain[0] -> chain[1] -> ...]
        wrong = (good[0] + 3) % V
        tokens = [root, wrong, *chain]
        parents = [-1, 0, 0, *range(2, 2 + len(chain) - 1)]
        return DraftTree(tokens, parents)

    def commit(self, state, tokens, feats):
        self.commits.append(list(tokens))
        state["tokens"].extend(tokens)

    def cache_len(self, state):
        return None


PROMPT = [3, 1, 4, 1, 5]


def run_loop(target, drafter, settings, **kw) -> list[ev.Event]:
    return list(decode.run(target, PROMPT, settings, drafter, **kw))


def check_stream(events: list[ev.Event], target: FakeTarget) -> list[int]:
    """Structural checks every run must pass; returns the generated tokens."""
    assert isinstance(events[0], ev.RunStarted) and isinstance(events[-1], ev.RunFinished)
    body = events[1:-1]
    assert len(body) % 4 == 0
    out: list[int] = []
    calls = []   # a drafter without taps sends the prompt with the first verify: split it off
    for cached, fed in target.calls:
        if not cached and len(fed) > len(PROMPT) - 1 and fed[:len(PROMPT) - 1] == PROMPT[:-1]:
            calls += [([], PROMPT[:-1]), (PROMPT[:-1], fed[len(PROMPT) - 1:])]
        else:
            calls.append((cached, fed))
    for s in range(len(body) // 4):
        d, v, a, kv = body[4 * s:4 * s + 4]
        assert (type(d), type(v), type(a), type(kv)) == (ev.DraftProposed, ev.Verified,
                                                         ev.Accepted, ev.KVUpdated)
        assert d.step == v.step == a.step == kv.step == s + 1
        # the cache holds every committed token but the root, which the tree starts with
        cached, fed = calls[s + 1]
        assert cached == (PROMPT + out)[:-1]
        assert fed == d.tokens[:v.input_tokens]
        assert d.tokens[0] == (out[-1] if out else PROMPT[-1])
        assert a.n_accepted == len(a.path) - 1
        # new tokens = accepted nodes + the target's token, cut at EOS
        assert a.new_tokens == ([d.tokens[i] for i in a.path[1:]] + [a.token])[:len(a.new_tokens)]
        past = kv.target_before - v.input_tokens
        assert past == len(cached)
        assert kv.target_after == past + len(a.path)
        assert kv.kept == [past + i for i in a.path]
        assert sorted(kv.kept + kv.dropped) == list(range(past, kv.target_before))
        out += a.new_tokens
    fin = events[-1]
    assert fin.new_tokens == len(out) and fin.target_forwards == len(body) // 4
    assert fin.text == target.decode(out)
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_decode_ar(temperature):
    target = FakeTarget()
    evs = run_loop(target, None, GenSettings(max_new_tokens=6, temperature=temperature))
    out = check_stream(evs, target)
    assert out == reference(PROMPT, 6)
    assert [e.n_accepted for e in evs if isinstance(e, ev.Accepted)] == [0] * 6
    assert target.calls[0] == ([], PROMPT)     # the prompt rides along with the first step
    assert evs[-1].stop_reason == "max_new_tokens"
    assert evs[-1].mean_accepted_length == 1.0


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("case, script, accepted", [
    ("never", [1], [0] * 10),
    ("always", [None], [3, 3, 1]),                           # last step capped by max_depth
    ("sometimes", [2, None, 1, 3], [1, 3, 0, 2]),         # step 4: depth 3 cut
])
def test_decode_chain(temperature, case, script, accepted):
    target, drafter = FakeTarget(), ScriptedDrafter(3, script)
    evs = run_loop(target, drafter, GenSettings(max_new_tokens=10, temperature=temperature))
    out = check_stream(evs, target)
    assert out == reference(PROMPT, 10)
    acc = [e for e in evs if isinstance(e, ev.Accepted)]
    assert [e.n_accepted for e in acc] == accepted
    want = "bonus" if case == "always" else ("argmax" if temperature == 0 else "residual")
    assert acc[0].source == want
    assert evs[-1].target_forwards == len(accepted)
    assert evs[-1].mean_accepted_length == pytest.approx(10 / len(accepted))
    # the drafter saw exactly what entered the target cache: root + accepted nodes
    flat = [t for c in drafter.commits for t in c]
    assert flat == (PROMPT[-1:] + out)[:-1]
    assert evs[-1].stop_reason == "max_new_tokens"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_decode_tree(temperature):
    target, drafter = FakeTarget(), ScriptedDrafter(3, [None, 2], tree=True)
    evs = run_loop(target, drafter, GenSettings(max_new_tokens=9, temperature=temperature))
    out = check_stream(evs, target)
    assert out == reference(PROMPT, 9)
    acc = [e for e in evs if isinstance(e, ev.Accepted)]
    assert [a.path for a in acc] == [[0, 2, 3, 4], [0, 2], [0, 2, 3]]
    kv = [e for e in evs if isinstance(e, ev.KVUpdated)]
    # the wrong sibling (node 1) is compacted away: a non-contiguous keep
    assert kv[0].kept == [4, 6, 7, 8] and kv[0].dropped == [5]
    ver = [e for e in evs if isinstance(e, ev.Verified)][0]
    assert ver.p[0] is None and ver.p[1] < 1e-10 and ver.p[2] == pytest.approx(1.0)
    assert ver.argmax[1] == ver.argmax[2] == out[0]


def test_decode_stops_at_eos_inside_an_accepted_path():
    ref = reference(PROMPT, 12)
    k = next(i for i in range(2, 12) if ref[i] not in ref[:i])
    target, drafter = FakeTarget(eos=ref[k]), ScriptedDrafter(4, [None])
    evs = run_loop(target, drafter, GenSettings(max_new_tokens=12))
    out = check_stream(evs, target)
    assert out == ref[:k + 1]
    assert evs[-1].stop_reason == "eos"


def test_decode_stops_at_context_and_on_cancel():
    target = FakeTarget(max_len=len(PROMPT) + 3)
    evs = run_loop(target, ScriptedDrafter(4, [None]), GenSettings(max_new_tokens=50))
    out = check_stream(evs, target)
    assert evs[-1].stop_reason == "context" and out == reference(PROMPT, len(out))
    assert len(PROMPT) + len(out) <= target.max_len
    cancel = threading.Event()
    cancel.set()
    evs = run_loop(FakeTarget(), None, GenSettings(max_new_tokens=5), cancel=cancel)
    assert [type(e) for e in evs] == [ev.RunStarted, ev.RunFinished]
    assert evs[-1].stop_reason == "cancelled" and evs[-1].new_tokens == 0


def test_decode_refuses_bad_requests():
    with pytest.raises(decode.BadRequest, match="empty"):
        list(decode.run(FakeTarget(), [], GenSettings()))
    with pytest.raises(decode.BadRequest, match="context"):
        list(decode.run(FakeTarget(max_len=3), PROMPT, GenSettings()))
    with pytest.raises(decode.BadRequest, match="temperature"):
        list(decode.run(FakeTarget(), PROMPT, GenSettings(temperature=float("nan"))))
