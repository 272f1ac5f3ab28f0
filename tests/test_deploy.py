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
