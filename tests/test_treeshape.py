"""EAGLE-1's static tree from measured acceptance (train/treeshape.py)."""
from collections import Counter

from specviz import events as ev
from specviz.drafters import eagle
from specviz.engine.decode import GenSettings, run
from specviz.train import treeshape as ts


def is_tree(paths):
    return all(p[:-1] in set(paths) or len(p) == 1 for p in paths)


def test_wide_is_a_depth_ordered_tree_holding_the_shipped_one():
    w = ts.wide()
    assert is_tree(w) and len(set(w)) == len(w)
    assert [len(p) for p in w] == sorted(len(p) for p in w)
    assert set(eagle.STATIC_TREE) <= set(w)


def test_shipped_static_tree_is_a_20_node_depth_ordered_tree():
    t = eagle.STATIC_TREE
    assert len(t) == len(set(t)) == 20 and is_tree(t)
    assert t == sorted(t, key=lambda p: (len(p), p))


def test_counts_and_choice():
    paths = [(0, 0, 1), (0, 0, 1), (1,), (), (0,)]
    c = ts.prefix_counts(paths)
    assert c == Counter({(0,): 3, (0, 0): 2, (0, 0, 1): 2, (1,): 1})
    shape = ts.wide(3)
    # (0, 0) and (0, 0, 1) tie: the shallower comes first; (1,) beats unaccepted paths
    assert ts.choose(c, shape, 2) == [(0,), (0, 0)]
    assert ts.choose(c, shape, 4) == [(0,), (1,), (0, 0), (0, 0, 1)]
    assert is_tree(ts.choose(c, shape, 9))
    assert ts.expected_tau(c, len(paths), [(0,), (0, 0)]) == 1 + 5 / 5


def test_a_sub_tree_accepts_what_the_wide_run_predicts(target):
    """The premise of the choice: under greedy verification a node is accepted exactly when its
    path is a prefix of the wide tree's accepted path. Checked on the first step, where both
    runs see the same context."""
    ids = target.encode("Write a Python function that reverses a string.")
    [wide_steps] = ts.accepted_paths(target, [ids], 4, ts.wide(), log=lambda _: None)
    first = wide_steps[0]
    sub = ts.choose(ts.prefix_counts([first]), ts.wide(), 12)   # holds the accepted path
    drafter = ts.static_drafter(target, sub)
    n = next(e.n_accepted for e in run(target, ids, GenSettings(max_new_tokens=4), drafter)
             if isinstance(e, ev.Accepted))
    assert n == len(first) == sum(ts.prefix_counts([first])[p] for p in sub)
