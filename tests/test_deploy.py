"""Deployment conventions: where the app listens, and the Space front matter of the README."""
import re
from pathlib import Path

import app

ROOT = Path(__file__).resolve().parents[1]


def test_flags_win_over_gradio_env():
    env = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "8080"}
    assert app.server_address("127.0.0.2", 9000, env) == ("127.0.0.2", 9000)


def test_gradio_env_wins_over_defaults():
    env = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "8080"}
    assert app.server_address(None, None, env) == ("0.0.0.0", 8080)


def test_defaults_local_and_space():
    assert app.server_address(None, None, {}) == ("127.0.0.1", 7860)
    assert app.server_address(None, None, {"SPACE_ID": "u/specviz"}) == ("0.0.0.0", 7860)


def front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("---\n")[1]
    return dict(line.split(": ", 1) for line in block.strip().splitlines())


def test_space_front_matter_pins_the_sdk_and_python():
    fm = front_matter()
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M))
    assert fm["sdk"] == "gradio"
    assert fm["sdk_version"] == pins["gradio"]
    assert fm["python_version"].strip('"') == "3.11"
    assert fm["app_file"] == "app.py"


def test_site_defaults_sit_under_request_overrides():
    from specviz import strategies
    try:
        strategies.set_defaults(strategies.parse_sets(["dflash:window=64", "eagle3:top_k=4"]))
        assert strategies.parse_settings("dflash").window == 64
        assert strategies.parse_settings("dflash", {"window": "8"}).window == 8
        assert strategies.parse_settings("eagle3").top_k == 4
    finally:
        strategies.set_defaults({})
    assert strategies.parse_settings("dflash").window == 0


def test_bad_site_default_is_refused():
    import pytest
    from specviz import strategies
    with pytest.raises(ValueError, match="STRATEGY:KEY=VALUE"):
        strategies.parse_sets(["window=64"])
    with pytest.raises(ValueError, match="no setting 'nope'"):
        strategies.parse_sets(["dflash:nope=1"])


def test_bring_your_own_lists_pairs_availability_and_serve_commands():
    from specviz import strategies
    from specviz.ui import bring_your_own

    class Tiny:
        model_id = "tiny/llama"
    try:
        strategies.set_defaults({"dflash": {"path": "z-lab/Qwen3-4B-DFlash-b16"}})
        text = bring_your_own.markdown(Tiny(), {"eagle3": "trained for another target"})
    finally:
        strategies.set_defaults({})
    assert "`tiny/llama`" in text
    assert "| `eagle3` | no | trained for another target |" in text
    assert "| `dflash` | yes | published folder `z-lab/Qwen3-4B-DFlash-b16` |" in text
    for model, sid, drafter, _ in bring_your_own.PAIRS:
        assert f"--model {model} --device cuda --set {sid}:path={drafter}" in text
    assert "python -m specviz export eagle3 --out exports/eagle3 --json" in text
    assert '"method": "eagle3"' in text and "--speculative-algorithm EAGLE3" in text
