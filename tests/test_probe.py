"""`train probe`: the fixed probe prompts are their own source, their answers are featurised once,
and a drafter's probe score is its teacher-forced chain over every answer, paired across weight
sets (tiny random target)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specviz.drafters import weights
from specviz.train import probe, probe_engine
from specviz.train.cli import main

from drafter_fixtures import tiny_data  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_probe_prompts_are_distinct_and_not_the_dev_ones():
    rows = [json.loads(x) for x in probe.PROBE_FILE.read_text().splitlines() if x.strip()]
    prompts = [r["prompt"] for r in rows]
    assert len(rows) >= 80 and len(set(prompts)) == len(prompts)
    assert len({r["id"] for r in rows}) == len(rows)
    cats = {r["category"] for r in rows}
    assert {"chat", "code", "math", "summarization", "qa", "writing", "structured",
            "rewrite"} <= cats
    dev = ROOT.parent / "shared/prompts/dev.jsonl"
    if dev.exists():
        assert not {json.loads(x)["prompt"] for x in dev.read_text().splitlines()
                    if x.strip()} & set(prompts)


def write_prompts(path: Path) -> Path:
    rows = [("a", "chat", "Why is the sky blue?"), ("b", "code", "Write a loop in Python."),
            ("c", "chat", "Name a fruit.")]
    path.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p}) + "\n"
                            for i, c, p in rows))
    return path


def weight_sets(target, tmp_path: Path, seed: int) -> tuple[Path, Path]:
    """Two assets folders of eagle3 weights: a trainable's own, and the same perturbed by 0.5."""
    from specviz.drafters.eagle3 import Eagle3Head
    from specviz.train.heads import Eagle3Trainable
    torch.manual_seed(seed)
    a, b = tmp_path / "a", tmp_path / "b"
    for assets, scale in ((a, 0.0), (b, 0.5)):
        tr = Eagle3Trainable(Eagle3Head(target, torch.arange(0, 49152, 12)), steps=3)
        with torch.no_grad():
            for p in tr.module.parameters():
                p.add_(scale * torch.randn_like(p))
        weights.save("eagle3", *tr.export(), target.fingerprint, assets=assets)
    return a, b


def test_probe_scores_and_pairs_weight_sets(tiny_target, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl")
    folder = probe.features(tiny_target, prompts, tmp_path / "f", 12, log=lambda s: None)
    built = (folder / "probe.safetensors").stat().st_mtime_ns
    assert probe.features(tiny_target, prompts, folder, 12, log=lambda s: None) == folder
    assert (folder / "probe.safetensors").stat().st_mtime_ns == built       # cached
    probe.features(tiny_target, prompts, folder, 10, log=lambda s: None)   # another length
    assert (folder / "probe.safetensors").stat().st_mtime_ns != built

    a, b = weight_sets(tiny_target, tmp_path, 0)
    cats = ["chat", "code", "chat"]
    ra, rb, ra2 = probe.score(tiny_target, "eagle3", [a, b, a], folder, cats, "fp32")
    assert ra["n"] > 0 and ra["n"] == rb["n"]
    assert ra["ci95"][0] <= ra["tau"] <= ra["ci95"][1]
    assert set(ra["tau_by_category"]) == {"chat", "code"}
    assert "vs_first" not in ra
    assert ra2["tau"] == ra["tau"] and ra2["vs_first"] == {"delta": 0.0, "ci95": (0.0, 0.0)}
    assert abs(rb["vs_first"]["delta"] - (rb["tau"] - ra["tau"])) < 1e-3
    # the score is the trainable's own evaluation over each whole answer
    tr = probe.trainable_for(tiny_target, "eagle3", b)
    per = probe.hits_by_prompt(tr, folder, "fp32")
    assert 1 + float(torch.cat([probe.lead(h) for h in per]).float().mean()) == \
        pytest.approx(rb["tau"], abs=1e-4)


def test_probe_cli_refuses_bad_input(capsys):
    for argv, msg in ((["probe", "--drafter", "nope"], "unknown drafter"),
                      (["probe", "--drafter", "eagle3", "--max-new-tokens", "0"], "1..1024"),
                      (["probe", "--drafter", "eagle3", "--prompts", "/nonexistent.jsonl"],
                       "cannot read prompt file")):
        with pytest.raises(SystemExit):
            main(argv)
        assert msg in capsys.readouterr().err


def test_probe_engine_runs_each_weight_set_and_pairs_by_prompt(tiny_target, tmp_path,
                                                                 monkeypatch):
    """`--engine`: the engine drafts with each folder's weights in turn (read while that folder
    is in use), its τ is new tokens per target forward, and a folder paired with itself
    differs by exactly 0."""
    from specviz import runner
    from specviz.engine.decode import GenSettings
    a, b = weight_sets(tiny_target, tmp_path, 1)
    read = []
    real_load = weights.load
    monkeypatch.setattr(weights, "load", lambda *x, **k: read.append(weights.folder())
                        or real_load(*x, **k))
    prompts = write_prompts(tmp_path / "p.jsonl")
    texts = [json.loads(x)["prompt"] for x in prompts.read_text().splitlines()]
    refs = probe.answers(probe.features(tiny_target, prompts, tmp_path / "f", 8, log=lambda s: None))
    cats = ["chat", "code", "chat"]
    ra, rb, ra2 = probe.engine_score(tiny_target, ["eagle3:auto_budget=false"], [a, b, a], refs,
                                     cats, 8, log=lambda s: None)
    assert read == [a, b, a]
    assert weights.folder() == weights.ASSETS and not tiny_target.drafters
    assert ra["tokens"] == sum(len(answer) for _, answer in refs) and 1 <= ra["tau"] <= 8
    assert ra["tau"] == pytest.approx(ra["tokens"] / ra["target_forwards"], abs=1e-4)
    assert ra["ci95"][0] <= ra["tau"] <= ra["ci95"][1] and set(ra["tau_by_category"]) == {"chat", "code"}
    assert ra2["tau"] == ra["tau"] and ra2["vs_first"] == {"delta": 0.0, "ci95": (0.0, 0.0)}
    assert rb["vs_first"]["delta"] == pytest.approx(rb["tau"] - ra["tau"], abs=1e-3)
    assert ra["greedy_match_rate"] == rb["greedy_match_rate"] == 1.0   # lossless: the target's answers
    with weights.use(b):   # the same figure as one engine run per prompt with b's weights
        runs = [runner.generate(tiny_target, strategy="eagle3", prompt_ids=runner.encode(
            tiny_target, p), gen=GenSettings(max_new_tokens=8), overrides={"auto_budget": "false"})
            for p in texts]
    from specviz import strategies
    strategies.forget(tiny_target)
    assert [pids for pids, _ in refs] == [runner.encode(tiny_target, p) for p in texts]
    assert rb["target_forwards"] == sum(r.finished.target_forwards for r in runs)
    # an answer the engine does not reproduce (not a near-tie) counts as a mismatch
    (pids, answer), *rest = refs
    wrong = [(pids, [(answer[0] + 1) % tiny_target.vocab, *answer[1:]]), *rest]
    _, _, matches = probe_engine.engine_runs(tiny_target, "eagle3:auto_budget=false", wrong, a, 8)
    assert matches.tolist() == [False, True, True]


def test_probe_engine_pairs_variants_of_one_weight_set(tiny_target, tmp_path, monkeypatch):
    """Several `--engine` variants: each runs with each weight set (variants outer), and every
    run is paired with the first variant's first weight set, so a sweep of one drafter's
    settings is one command; the same variant twice differs by exactly 0."""
    a, b = weight_sets(tiny_target, tmp_path, 5)
    refs = probe.answers(probe.features(tiny_target, write_prompts(tmp_path / "p.jsonl"),
                                        tmp_path / "f", 8, log=lambda s: None))
    tree, chain = "eagle3:auto_budget=false", "eagle3:mode=chain:gamma=2"
    made, real = [], probe_engine.engine_runs
    monkeypatch.setattr(probe_engine, "engine_runs", lambda t, v, r, assets, n: made.append(
        (v, assets)) or real(t, v, r, assets, n))
    runs = probe.engine_score(tiny_target, [tree, chain, tree], [a, b], refs,
                              ["chat", "code", "chat"], 8, log=lambda s: None)
    order = [(v, w) for v in (tree, chain, tree) for w in (a, b)]
    assert made == order and [(r["variant"], r["assets"]) for r in runs] == [
        (v, str(w)) for v, w in order]
    first = runs[0]
    assert "vs_first" not in first and runs[4]["vs_first"] == {"delta": 0.0, "ci95": (0.0, 0.0)}
    assert runs[2]["vs_first"]["delta"] == pytest.approx(runs[2]["tau"] - first["tau"], abs=1e-3)
    assert all(r["greedy_match_rate"] == 1.0 for r in runs)


def test_engine_runs_are_kept_and_reused_until_what_they_depend_on_changes(tiny_target, tmp_path,
                                                                            monkeypatch):
    """A weight set's engine runs are made once per cache: the same call reads them back (also
    when another drafter's weights in the folder change), while other weights of the drafter,
    another variant or another answer length run the engine again."""
    a, b = weight_sets(tiny_target, tmp_path, 3)
    folder = probe.features(tiny_target, write_prompts(tmp_path / "p.jsonl"), tmp_path / "f", 8,
                            log=lambda s: None)
    refs = probe.answers(folder)
    made = []
    real = probe_engine.engine_runs
    monkeypatch.setattr(probe_engine, "engine_runs", lambda t, v, r, assets, n: made.append(
        (v, assets, n)) or real(t, v, r, assets, n))
    cache, cats, v = tmp_path / "cache", ["chat", "code", "chat"], "eagle3:auto_budget=false"
    first = probe.engine_score(tiny_target, [v], [a, b], refs, cats, 8, lambda s: None, cache)
    [kept] = cache.glob("*.json")                              # one key, two weight sets
    assert made == [(v, a, 8), (v, b, 8)] and len(json.loads(kept.read_text())["runs"]) == 2
    again = probe.engine_score(tiny_target, [v], [a, b], refs, cats, 8, lambda s: None, cache)
    assert again == first and len(made) == 2                 # read back, not run
    (a / "draft.safetensors").write_bytes(b"another drafter's weights")
    assert probe.engine_score(tiny_target, [v], [a], refs, cats, 8, lambda s: None,
                              cache) == first[:1] and len(made) == 2   # not what eagle3 reads
    probe.engine_score(tiny_target, ["eagle3:mode=chain"], [a], refs, cats, 8, lambda s: None, cache)
    probe.engine_score(tiny_target, [v], [a], refs, cats, 6, lambda s: None, cache)
    assert made[2:] == [("eagle3:mode=chain", a, 8), (v, a, 6)]
    (b / "eagle3.safetensors").write_bytes((a / "eagle3.safetensors").read_bytes())
    [rb] = probe.engine_score(tiny_target, [v], [b], refs, cats, 8, lambda s: None, cache)
    assert len(made) == 4 and rb["tau"] == first[0]["tau"]   # a's weights, wherever they lie
    _, other = weight_sets(tiny_target, tmp_path / "other", 4)
    (b / "eagle3.safetensors").write_bytes((other / "eagle3.safetensors").read_bytes())
    probe.engine_score(tiny_target, [v], [b], refs, cats, 8, lambda s: None, cache)
    assert made[4:] == [(v, b, 8)]                           # new weights: run anew
    # the key covers the engine's source and the module making the runs, not the statistics
    names = {p.name for p in probe_engine.engine_sources()}
    assert {"probe_engine.py", "verify.py", "runner.py"} <= names and "probe.py" not in names
    probe.engine_score(tiny_target, [v], [a], refs, cats, 8, lambda s: None)
    assert made[5:] == [(v, a, 8)]                           # no cache: always run


def test_engine_runs_made_in_parallel_processes_are_all_kept(tiny_target, tmp_path, monkeypatch):
    """Two probes of one variant in parallel processes: the one finishing last keeps the runs
    that the other wrote while it ran (the cache file is read again, under a lock, to append)."""
    a, b = weight_sets(tiny_target, tmp_path, 3)
    folder = probe.features(tiny_target, write_prompts(tmp_path / "p.jsonl"), tmp_path / "f", 8,
                            log=lambda s: None)
    refs, cache, v = probe.answers(folder), tmp_path / "cache", "eagle3:auto_budget=false"
    real = probe_engine.engine_runs

    def with_a_rival(t, variant, r, assets, n):   # b's process finishes while a's runs
        if assets == a:
            probe_engine.cached_engine_runs(t, variant, r, b, n, cache, lambda s: None)
        return real(t, variant, r, assets, n)
    monkeypatch.setattr(probe_engine, "engine_runs", with_a_rival)
    probe_engine.cached_engine_runs(tiny_target, v, refs, a, 8, cache, lambda s: None)
    [kept] = cache.glob("*.json")
    assert [r["assets"] for r in json.loads(kept.read_text())["runs"]] == [str(b), str(a)]


def test_probe_cli_refuses_a_bad_engine_variant(capsys):
    for variant, msg in (("nope", "unknown strategy"), ("eagle3:depth=-1", "--engine")):
        with pytest.raises(SystemExit):
            main(["probe", "--drafter", "eagle3", "--engine", variant])
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit):          # a card's table pairs weight sets of one variant
        main(["probe", "--drafter", "eagle3", "--card", "x", "--engine", "eagle3",
              "--engine", "eagle3:mode=chain"])
    assert "--card takes one --engine variant" in capsys.readouterr().err


def test_a_dspark_probe_needs_no_training_feature_folder(tiny_target, tmp_path, monkeypatch):
    """DSpark's trainable opens its held-out calibration data only at export, so probing its
    weights works where no training feature folder was ever built (a fresh checkout)."""
    from specviz.drafters.dspark import DSparkModel
    from specviz.drafters.layers import LayerShape
    from specviz.train.blocks import MARKOV_RANK
    model = DSparkModel(LayerShape.of(tiny_target), torch.arange(0, 49152, 12), tiny_target.vocab,
                        block=16, n_layers=2, rank=MARKOV_RANK)
    weights.save("dspark", dict(model.state_dict()), {"block": 16}, tiny_target.fingerprint,
                 assets=tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    assert not (tmp_path / "artifacts").exists()
    tr = probe.trainable_for(tiny_target, "dspark", tmp_path / "a")
    assert tr.dspark is not None and tr.size == 16
    assert torch.equal(tr.backbone.vocab, torch.arange(0, 49152, 12))


def test_the_probe_never_writes_into_a_training_feature_folder(tiny_target, tiny_data, tmp_path):
    from specviz.train import data as D
    prompts = write_prompts(tmp_path / "p.jsonl")
    with pytest.raises(D.FeatureError, match="holds training features"):
        probe.features(tiny_target, prompts, tiny_data, 12, log=lambda s: None)
    assert not (tiny_data / "probe.safetensors").exists()


def test_probe_card_writes_one_section_into_the_candidates_card(tiny_target, tmp_path,
                                                                monkeypatch, capsys):
    """`--card LABEL`: the reports go into the last weight set's card as one section above its
    earlier ones, every figure as the JSON report gives it; a rerun replaces the section."""
    from specviz.train import cli
    a, b = weight_sets(tiny_target, tmp_path, 2)
    card = b / "eagle3.md"
    card.write_text("# `eagle3`\n\n| | |\n|---|---|\n\nReproduce: x\n\n## Measured before\n\nold\n")
    monkeypatch.setattr(cli, "embedded_target", lambda args: tiny_target)
    argv = ["probe", "--drafter", "eagle3", "--assets", str(a), "--assets", str(b),
            "--prompts", str(write_prompts(tmp_path / "p.jsonl")), "--data", str(tmp_path / "f"),
            "--max-new-tokens", "8", "--engine", "eagle3:auto_budget=false", "--json"]
    assert main([*argv, "--card", "round 2"]) == 0
    out = json.loads(capsys.readouterr().out)
    text = card.read_text()
    head = "## Measured on the probe prompts (round 2)"
    assert text.count(head) == 1 and text.index("Reproduce: x") < text.index(head) < \
        text.index("## Measured before\n\nold\n")
    tf, eng = out["teacher_forced"], out["engine"]
    assert f"| `{a}` | {probe.interval(tf[0])} | – | {probe.interval(eng[0])} | – | 1.00 |" in text
    d, e = tf[1]["vs_first"], eng[1]["vs_first"]
    assert (f"| `{b}` | {probe.interval(tf[1])} | **{probe.signed(d['delta'])}** "
            f"[{probe.signed(d['ci95'][0])}, {probe.signed(d['ci95'][1])}] | "
            f"{probe.interval(eng[1])} | **{probe.signed(e['delta'])}**") in text
    assert [probe.signed(x) for x in (0.0, -0.0003, 0.0418)] == ["+0.000", "-0.0003", "+0.042"]
    assert f"| code | {tf[0]['tau_by_category']['code']:.2f} / " \
           f"{eng[0]['tau_by_category']['code']:.2f} |" in text
    assert "`python -m specviz train probe --drafter eagle3 --assets" in text
    assert not (a / "eagle3.md").exists()                    # only the candidate's card
    assert main([*argv, "--card", "round 2"]) == 0           # rerun: replaced, not repeated
    assert card.read_text().count(head) == 1


def test_a_soup_averages_fine_tunes_of_the_same_weights(tiny_target, tmp_path):
    """`train soup`: the average of two weight sets is their mean tensor by tensor (bf16 as
    shipped), loads back with their configuration, and its card names each ingredient by its hash; weights of
    another draft vocabulary or another target are refused with a reason, and nothing is
    written."""
    from specviz.train import soup
    a, b = weight_sets(tiny_target, tmp_path, 6)
    out = tmp_path / "soup"
    assert main(["soup", "--drafter", "eagle3", "--assets", str(a), "--assets", str(b),
                 "--out", str(out), "--note", "A test soup."]) == 0
    got, cfg = weights.load("eagle3", tiny_target.fingerprint, out)
    ta, ca = weights.load("eagle3", tiny_target.fingerprint, a)
    tb, _ = weights.load("eagle3", tiny_target.fingerprint, b)
    assert cfg == ca and set(got) == set(ta)
    for k, v in got.items():
        if v.is_floating_point():
            torch.testing.assert_close(v, ((ta[k] + tb[k]) / 2).bfloat16().float())
        else:
            assert torch.equal(v, ta[k])
    assert not torch.equal(got["fc.weight"], ta["fc.weight"])
    card = (out / "eagle3.md").read_text()
    assert "## Weight average of 2 weight sets" in card and "A test soup." in card
    assert soup.digest("eagle3", a) in card and soup.digest("eagle3", b) in card
    # the soup of a folder with itself is that folder's weights
    same, _, _ = soup.average("eagle3", [a, a])
    assert all(torch.equal(same[k], ta[k]) for k in ta)

    other = tmp_path / "other"
    tensors, config = weights.load("eagle3", tiny_target.fingerprint, a)
    tensors["vocab_ids"] = tensors["vocab_ids"].flip(0)
    weights.save("eagle3", tensors, config, tiny_target.fingerprint, assets=other)
    with pytest.raises(soup.SoupError, match="another draft vocabulary"):
        soup.average("eagle3", [a, other])
    weights.save("eagle3", ta, ca, "0123456789abcdef", assets=other)
    with pytest.raises(soup.SoupError, match="another target"):
        soup.average("eagle3", [a, other])
    with pytest.raises(soup.SoupError, match="at least two"):
        soup.average("eagle3", [a])
    with pytest.raises(SystemExit):
        main(["soup", "--drafter", "eagle3", "--assets", str(a), "--assets",
              str(tmp_path / "nowhere"), "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()
