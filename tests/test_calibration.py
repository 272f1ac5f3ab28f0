"""Sequential calibration (temperature and bias per position) on synthetic confidences with a known
miscalibration, and calibration on engine runs."""
from __future__ import annotations

import pytest
import torch

from specviz.train import calibrate


def synthetic(n=4000, gamma=5, seed=0, shift=0.0):
    """True per-position acceptance c_k = σ(z_k); the reported logits are 3x overconfident (and
    `shift` too high: an offset no temperature undoes)."""
    g = torch.Generator().manual_seed(seed)
    true_z = torch.randn(n, gamma, generator=g) * 1.2 + 1.0
    acc = torch.rand(n, gamma, generator=g) < torch.sigmoid(true_z)
    return 3.0 * (true_z + shift), acc


def test_ece_and_auc_basics():
    s = torch.tensor([0.1, 0.4, 0.35, 0.8])
    y = torch.tensor([0, 0, 1, 1])
    assert calibrate.auc(s, y) == 0.75
    assert calibrate.ece(torch.full((10,), 0.7), torch.tensor([1] * 7 + [0] * 3)) < 1e-6
    assert abs(calibrate.ece(torch.full((4,), 0.9), torch.tensor([1, 0, 0, 0])) - 0.65) < 1e-6


def test_sequential_calibration_lowers_ece():
    z, acc = synthetic()
    temps, biases = calibrate.sequential_fit(z, acc)
    assert all(2.3 < t < 3.5 for t in temps.tolist())     # undoes the 3x overconfidence
    assert all(abs(b) < 0.2 for b in biases.tolist())      # and needs no offset
    z2, acc2 = synthetic(seed=1)                           # judged on fresh draws
    rep = calibrate.report(z2, acc2, temps, biases)
    assert rep["ece_after"] < 0.02 < rep["ece_before"]
    assert rep["auc"] > 0.7


def test_the_bias_undoes_an_offset_a_temperature_cannot():
    z, acc = synthetic(shift=1.0)
    temps, biases = calibrate.sequential_fit(z, acc)
    assert all(2.3 < t < 3.5 for t in temps.tolist())
    assert all(-1.4 < b < -0.9 for b in biases.tolist())  # the offset: -1 at T = 3
    z2, acc2 = synthetic(seed=1, shift=1.0)
    s2 = acc2.double().cumprod(-1)
    fitted = calibrate.survival(z2, temps, biases)
    temperature_only = calibrate.survival(z2, temps)       # the same slopes without the offsets
    for k in range(3):
        assert abs(fitted[:, k].mean() - s2[:, k].mean()) < 0.02
        assert temperature_only[:, k].mean() - s2[:, k].mean() > 0.05


def test_survival_is_a_non_increasing_prefix_product():
    z, _ = synthetic(n=50)
    a = calibrate.survival(z, torch.full((5,), 2.0), torch.linspace(-1, 1, 5))
    assert (a[:, 1:] <= a[:, :-1]).all() and ((a > 0) & (a < 1)).all()


# --- calibration on engine runs (train/recalibrate.py) ----------------------------------------
def test_fit_reports_on_the_other_half_per_position():
    from specviz.train import recalibrate
    z, acc = synthetic(n=6000, gamma=4)
    s = acc.double().cumprod(-1)
    half = torch.arange(len(z)) % 2 == 0
    temps, biases, rep = recalibrate.fit(z.double(), s, half)
    for t in (temps, biases):
        assert torch.equal(t, t.to(torch.bfloat16).float())              # as shipped
    assert rep["blocks_fit"] == rep["blocks_report"] == 3000
    raw = recalibrate.score(z[~half], s[~half], torch.ones(4), torch.zeros(4))["by_position"]
    for before, after in zip(raw, rep["after"]["by_position"]):            # sampling noise at n = 3000: ~0.02
        assert abs(after["gap"]) < 0.05 and after["ece"] < 0.05 < before["ece"]
    assert [r["position"] for r in raw] == [1, 2, 3, 4]
    assert raw[0]["mean_a"] > rep["after"]["by_position"][0]["mean_a"]  # 3x overconfident before
    assert abs(raw[0]["realized"] - rep["after"]["by_position"][0]["realized"]) < 1e-12


def test_calibration_instructions_are_stratified_and_unused(tmp_path):
    from specviz.train import recalibrate, shards
    items = recalibrate.instructions(2)
    by = {}
    for it in items:
        assert recalibrate.FIRST_INDEX <= it["index"] < recalibrate.FIRST_INDEX + recalibrate.SPAN
        by[it["source"]] = by.get(it["source"], 0) + 1
    assert by == {k: 2 * n for k, n in recalibrate.MIX.items()}
    recalibrate.check_unused(tmp_path)                                   # no shards: fine
    row = {"prompt_ids": [1, 2], "response_ids": [3], "source": "math", "index": 0}
    md = {"stream": "pool", "seed": 0, "first": recalibrate.FIRST_INDEX - 1, "count": 2,
          "fingerprint": "x", "target": "x", "max_new_tokens": 8, "stream_version": "1"}
    shards.write(tmp_path, 1, [row, row], md)
    with pytest.raises(RuntimeError, match="calibration range"):
        recalibrate.check_unused(tmp_path)
    shards.write(tmp_path / "v2", 1, [row, row], md | {"stream_version": "2"})
    recalibrate.check_unused(tmp_path / "v2")        # the same indices of another stream: fine


def test_card_section_is_replaced_not_repeated():
    from specviz.drafters import weights
    from specviz.train import recalibrate
    card = "# dspark\n\nintro\n\n## Measured\n\ntable\n"
    sec = recalibrate.SECTION + "\n\nfirst\n"
    once = weights.with_section(card, sec)
    assert once.index(recalibrate.SECTION) < once.index("## Measured")
    twice = weights.with_section(once, recalibrate.SECTION + "\n\nsecond\n")
    assert twice.count(recalibrate.SECTION) == 1 and "second" in twice and "first" not in twice
    assert twice.endswith("## Measured\n\ntable\n")


def test_collect_on_the_real_drafter(target):
    from specviz.train import recalibrate
    z, s, prompt = recalibrate.collect(target, ["Name three colours.", "What is 2 + 3?"], 12,
                                       log=lambda _: None)
    assert z.shape == s.shape and z.shape[1] == 16 and torch.isfinite(z).all()
    assert (s[:, 1:] <= s[:, :-1]).all()                                 # survival labels
    assert prompt.tolist() == sorted(prompt.tolist()) and set(prompt.tolist()) == {0, 1}


def test_sparse_positions_keep_the_previous_calibration():
    z, acc = synthetic(n=400, gamma=5)
    acc[:, 2] = False                                      # nothing survives past position 2
    temps, biases = calibrate.sequential_fit(z, acc)
    assert temps[2] == temps[3] == temps[4] == temps[1]
    assert biases[2] == biases[3] == biases[4] == biases[1]


def test_positions_without_failures_keep_the_previous_calibration():
    """Every block that reaches position 3 survives it: the likelihood has no finite optimum
    there, so the fit keeps position 2's pair instead of a runaway temperature."""
    z, acc = synthetic(n=4000, gamma=5)
    acc[:, 2] = True
    temps, biases = calibrate.sequential_fit(z, acc)
    assert temps[2] == temps[1] and biases[2] == biases[1]
    assert 2.3 < float(temps[1]) < 3.5 and 1.0 < float(temps[3]) < 5.0      # the others still fit


def test_saved_engine_runs_are_reused_only_for_the_same_weights_and_settings(tmp_path):
    from specviz.train import recalibrate
    z, acc = synthetic(n=50, gamma=4)
    s, prompt = acc.double().cumprod(-1), torch.arange(50) % 7
    key = {"prompts": 84, "per_source": 12, "max_new_tokens": 128, "weights": "abc"}
    path = tmp_path / "runs" / "dspark.safetensors"
    assert recalibrate.saved_runs(path, key) is None                      # nothing saved yet
    recalibrate.save_runs(path, z.double(), s, prompt, key)
    got = recalibrate.saved_runs(path, key)
    assert all(torch.equal(a, b) for a, b in zip(got, (z.double(), s, prompt)))
    assert recalibrate.saved_runs(path, key | {"weights": "abd"}) is None   # retrained drafter
    assert recalibrate.saved_runs(path, key | {"max_new_tokens": 64}) is None


def test_report_on_a_prompt_file_scores_the_shipped_calibration(target, tmp_path, capsys):
    """`train calibrate --report-on FILE`: engine runs of the file's prompts, scored per position
    under the shipped calibration; nothing is written. A bad file is a clear error."""
    from specviz.drafters import weights
    from specviz.train import cli, recalibrate
    before = [f.read_bytes() for f in weights.files("dspark")]
    got = recalibrate.report_on(target, ["Name three colours."], 10, log=lambda _: None)
    assert [r["position"] for r in got["by_position"]] == [1, 2, 3, 4] and got["blocks"] >= 1
    for r in got["by_position"]:
        assert 0 <= r["mean_a"] <= 1 and 0 <= r["realized"] <= 1
        assert abs(r["gap"] - (r["mean_a"] - r["realized"])) < 1e-9
    assert [f.read_bytes() for f in weights.files("dspark")] == before
    with pytest.raises(SystemExit) as exit_:
        cli.main(["calibrate", "--report-on", str(tmp_path / "none.jsonl")])
    assert exit_.value.code == 2 and "cannot read prompt file" in capsys.readouterr().err


def test_fit_on_a_prompt_file_ships_into_the_folder_in_use(target, tmp_path, capsys):
    """`train calibrate --fit-on FILE`: the engine runs of the file's prompts are fitted (even
    prompts) and reported (odd ones); the fit is written, with a card section naming the file,
    into the assets folder in use, here a copy, so assets/ is untouched."""
    import json
    import shutil

    from specviz.drafters import weights
    from specviz.train import cli, recalibrate
    before = [f.read_bytes() for f in weights.files("dspark")]
    folder = tmp_path / "assets"
    folder.mkdir()
    for f in [*weights.files("dspark"), weights.ASSETS / "dspark.md"]:
        shutil.copy(f, folder)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in
                               enumerate(["Name three colours.", "What is 2 + 3?",
                                          "Say hello in French.", "List two fruits."])))
    with weights.use(folder):
        report = recalibrate.run(target, max_new_tokens=10, prompt_file=prompts,
                                 cmd="python -m specviz train calibrate --fit-on p.jsonl",
                                 log=lambda _: None)
        shipped, _ = weights.load("dspark", target.fingerprint)
    assert report["prompts"] == 4 and report["prompt_file"] == "p.jsonl"
    assert torch.equal(shipped["temperature"], torch.tensor(report["temperatures"]))
    card = (folder / "dspark.md").read_text()
    assert "(4 prompts of p.jsonl, which no training shard answers; greedy, 10 new tokens" in card
    assert card.count(recalibrate.SECTION) == 1
    assert [f.read_bytes() for f in weights.files("dspark")] == before
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--fit-on", str(prompts), "--report-on", str(prompts)])
    assert "not both" in capsys.readouterr().err
