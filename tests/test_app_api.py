"""gradio_client against the launched app: the /speculate contract, streaming, clear errors."""
from __future__ import annotations

import pytest

gradio_client = pytest.importorskip("gradio_client")

CONTRACT = {"new_tokens", "wall_s", "tokens_per_s", "target_forwards", "mean_accepted_length",
            "acceptance_by_position", "draft_s", "verify_s"}


@pytest.fixture(scope="module")
def client(app_url):
    return gradio_client.Client(app_url, verbose=False)


def test_speculate_contract(client):
    prompt = "Repeat exactly: one two three four five six seven eight."
    text, m = client.predict(prompt, "ngram", 24, 0.0, 0, api_name="/speculate")
    assert CONTRACT <= set(m)
    assert isinstance(text, str) and text
    assert 1 <= m["new_tokens"] <= 24 and m["target_forwards"] >= 1
    assert m["mean_accepted_length"] == pytest.approx(m["new_tokens"] / m["target_forwards"])
    ar_text, ar_m = client.predict(prompt, "ar", 24, 0.0, 0, api_name="/speculate")
    assert ar_text == text                     # lossless under greedy
    assert ar_m["mean_accepted_length"] == 1.0


def test_speculate_stream_yields_several_updates(client):
    # long enough (about 6 s of decoding on a quiet 2-core CPU) for several 0.25 s updates
    job = client.submit("Write a long story about a dragon who learns to bake bread.", "ar", 96,
                        0.0, 0, api_name="/speculate_stream")
    job.result()
    outs = job.outputs()
    assert len(outs) >= 3
    counts = [m["new_tokens"] for _, m in outs]
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_bad_input_is_a_clear_error(client):
    with pytest.raises(Exception, match="unknown strategy"):
        client.predict("hi", "no-such-strategy", 8, 0.0, 0, api_name="/speculate")
    with pytest.raises(Exception, match="temperature"):
        client.predict("hi", "ar", 8, -1.0, 0, api_name="/speculate")


def test_api_is_documented(client):
    info = client.view_api(print_info=False, return_format="dict")
    assert "/speculate" in info["named_endpoints"]
    params = [p["parameter_name"] for p in info["named_endpoints"]["/speculate"]["parameters"]]
    assert params == ["prompt", "strategy", "max_new_tokens", "temperature", "seed"]


def test_playground_settings_come_from_the_registry():
    """Every strategy's own settings show with their defaults and a meaning; overrides read back."""
    from specviz import strategies
    from specviz.ui import playground

    for sid, sp in strategies.REGISTRY.items():
        rows = playground.settings_rows(sid)
        if sp.settings is None:
            assert rows == []
            continue
        names = [r[0] for r in rows]
        assert names == list(strategies.settings_dict(strategies.parse_settings(sid)))
        assert all(r[2] for r in rows), f"{sid}: a setting without a meaning in SETTING_HELP"
        assert strategies.parse_settings(sid, playground.overrides(rows)) == \
            strategies.parse_settings(sid)


def test_downloads_keep_names_and_stay_bounded(monkeypatch):
    from specviz.ui import downloads
    monkeypatch.setattr(downloads, "KEEP", 3)
    paths = []
    for i in range(5):
        p = downloads.new_path("specviz-trace.jsonl")
        p.write_text(str(i))
        paths.append(p)
    assert all(p.name == "specviz-trace.jsonl" for p in paths)
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    assert [p.read_text() for p in paths[2:]] == ["2", "3", "4"]


def test_concurrent_speculate_callers_share_the_batch(client):
    """Batchable requests from concurrent callers ride in one batched engine; each caller gets
    exactly its own single-request text."""
    prompts = ["Name two colors.", "Say hello in French.", "What is 3 + 4?"]
    jobs = [client.submit(p, "ar", 12, 0.0, 0, api_name="/speculate") for p in prompts]
    together = [job.result() for job in jobs]
    for (text, m), p in zip(together, prompts):
        assert m["batched"] is True and CONTRACT <= set(m)
        assert m["mean_accepted_length"] == 1.0 and 1 <= m["new_tokens"] <= 12
        alone_text, _ = client.predict(p, "ar", 12, 0.0, 0, api_name="/speculate")
        assert text == alone_text
