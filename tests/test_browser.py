"""End to end in a real browser (Playwright + Debian's chromium) against the launched app.

Screenshots go to artifacts/screenshots/; the streaming measurements (Run -> first step
visible, view updates per second on a 256-token run) to artifacts/app_speed.json. Speed is
measured and reported, not asserted with tight timing.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SHOTS = ARTIFACTS / "screenshots"

# Log every change of the metrics panel's "N for M tokens" card with its browser time.
WATCH = """() => {
  window.__log = []; const el = document.querySelector('#pg-metrics');
  const note = () => { const m = el.innerText.match(/(\\d+) for (\\d+) tokens/);
    const key = m ? m[0] : ''; const last = window.__log[window.__log.length - 1];
    if (!last || last.key !== key) window.__log.push({t: performance.now(), key, fwd: m ? +m[1] : -1}); };
  new MutationObserver(note).observe(el, {childList: true, subtree: true, characterData: true});
  return performance.now(); }"""


@pytest.fixture(scope="module")
def browser(app_url):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (apt-get install -y chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, app_url, context: bool = False, width: int = 1400, height: int = 1000):
    """A loaded, settled app page (on a fresh page the browser spends ~1.5 s parsing plotly.js
    just after the buttons appear); context=True gives it its own browser context (cookies,
    storage: a separate user)."""
    size = {"width": width, "height": height}
    pg = browser.new_context(viewport=size).new_page() if context else browser.new_page(
        viewport=size)
    pg.set_default_timeout(60_000)
    pg.goto(app_url)
    pg.wait_for_selector("#pg-tree .js-plotly-plot")     # plotly.js loaded with the page
    pg.evaluate("() => new Promise(r => requestIdleCallback(r))")   # and the page settled
    return pg


@pytest.fixture(scope="module")
def page(browser, app_url):
    return open_page(browser, app_url)


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def pick_strategy(page, strategy: str) -> None:
    page.locator("#pg-strategy input").click()
    page.get_by_role("option", name=re.compile(rf"^{re.escape(strategy)} — ")).click()


def open_settings(page) -> None:
    if not page.locator("#pg-max-new input").is_visible():
        page.get_by_text("generation settings", exact=True).click()


def run_playground(page, prompt: str, max_new: int, strategy: str | None = None) -> dict:
    """Press Run and wait for the run to end; return the browser-side timing of its updates."""
    if strategy:
        pick_strategy(page, strategy)
    open_settings(page)
    page.locator("#pg-prompt textarea").fill(prompt)
    page.locator("#pg-max-new input").fill(str(max_new))
    t0 = page.evaluate(WATCH)
    page.click("#pg-run")
    page.wait_for_selector("#pg-message:has-text('Running')")
    page.wait_for_function("!document.querySelector('#pg-message').innerText.includes('Running')",
                           timeout=180_000)
    log = page.evaluate("window.__log")
    cleared = next(i for i, x in enumerate(log) if x["fwd"] == 0)   # Run resets the panel
    steps = [x for x in log[cleared:] if x["fwd"] > 0]
    first, last = steps[0]["t"], steps[-1]["t"]
    return {"first_step_s": (first - t0) / 1000, "updates": len(steps),
            "stream_s": (last - first) / 1000,
            "updates_per_s": (len(steps) - 1) / ((last - first) / 1000) if last > first else None,
            "final": steps[-1]["key"]}


def test_playground_opens_on_a_recorded_run(page):
    """Before any Run, the tab shows a shipped recorded run, drawn: tokens, tree and metrics."""
    assert "recorded run" in page.inner_text("#pg-message")
    assert "finished" in page.inner_text("#pg-metrics")
    assert page.locator("#pg-tokens .sv-tok").count() > 10
    assert page.locator("#pg-tree .js-plotly-plot .point, #pg-tree .js-plotly-plot .scatter"
                        ).count() > 0
    shot(page, "playground-opening")


def test_playground_ngram_shows_tree_and_metrics(page):
    first = run_playground(page, "Here is a list: red, green, blue, cyan. Repeat the list.", 24)
    assert page.locator("#pg-tree .js-plotly-plot").count() == 1
    assert page.locator("#pg-metrics .sv-card").count() == 4
    assert page.locator("#pg-tokens .sv-accepted, #pg-tokens .sv-target, "
                        "#pg-tokens .sv-corrected, #pg-tokens .sv-bonus").count() > 0
    assert "tokens" in first["final"]
    shot(page, "playground-ngram")
    long = run_playground(page, "Write a long, detailed story about a lighthouse keeper and a "
                                "storm, with many characters.", 256)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "app_speed.json").write_text(json.dumps(
        {"first_run_fresh_page_24_tokens": first, "run_256_tokens": long},
        indent=2))
    assert long["updates"] >= 3


def test_script_prompt_shows_literally_and_bad_input_message(page):
    run_playground(page, "<script>window.__pwned = 1</script><b>bold?</b>", 4)
    text = page.inner_text("#pg-tokens")
    assert "<script>window.__pwned = 1</script>" in text and "<b>bold?</b>" in text
    assert page.evaluate("window.__pwned === undefined")
    page.locator("#pg-prompt textarea").fill("")
    page.click("#pg-run")
    page.wait_for_selector("#pg-message .sv-msg-error:has-text('Enter a prompt')")
    page.locator("#pg-prompt textarea").fill("hello")
    page.locator("#pg-temperature input").fill("-3")
    page.click("#pg-run")
    page.wait_for_selector("#pg-message .sv-msg-error:has-text('temperature')")
    shot(page, "bad-input")
    page.locator("#pg-temperature input").fill("0")
    page.locator("#pg-strategy input").click()
    missing = page.get_by_role("option").filter(has_text="unavailable")
    if missing.count():                         # a drafter whose weights are not there
        missing.first.click()
        page.click("#pg-run")
        page.wait_for_selector("#pg-message .sv-msg-error:has-text('unavailable')")
        page.locator("#pg-strategy input").click()
    page.get_by_role("option", name=re.compile(r"^ngram — ")).click()


@pytest.mark.parametrize("strategy, marker", [("eagle2", "#pg-tree:has-text('EAGLE-2')"),
                                               ("dspark", "#pg-confidence:has-text('hardware-aware')")])
def test_learned_strategy_in_playground(page, strategy, marker):
    page.locator("#pg-strategy input").click()
    option = page.get_by_role("option", name=re.compile(rf"^{strategy} — "))
    unavailable = "unavailable" in option.inner_text()
    option.click()
    if unavailable:
        pytest.skip(f"{strategy} weights are not in assets/")
    run_playground(page, "In two sentences, why is the sky blue?", 12)
    assert "finished" in page.inner_text("#pg-metrics")
    page.wait_for_selector(marker)
    shot(page, f"playground-{strategy}")
    pick_strategy(page, "ngram")


def test_stop_cancels_the_run(page):
    open_settings(page)
    page.locator("#pg-prompt textarea").fill("Write a long story about a cat and a violin.")
    page.locator("#pg-max-new input").fill("256")
    page.click("#pg-run")
    page.wait_for_function(
        "/[1-9][0-9]* for [0-9]+ tokens/.test(document.querySelector('#pg-metrics').innerText)")
    page.click("#pg-stop")
    page.wait_for_selector("#pg-metrics .sv-status:has-text('cancelled')", timeout=30_000)
    done = int(page.inner_text("#pg-metrics").split(" for ")[1].split(" tokens")[0])
    assert done < 256


def test_compare_two_strategies(page):
    page.get_by_role("tab", name="Compare").click()
    boxes = page.locator("#cmp-strategies input[type=checkbox]")
    for i in range(boxes.count()):
        box = boxes.nth(i)
        want = box.evaluate("b => b.closest('label').innerText.trim() === 'ngram'")
        if box.is_checked() != want:
            box.click()
    page.locator("#cmp-prompt textarea").fill("Repeat exactly: alpha beta gamma delta.")
    page.click("#cmp-run")
    page.wait_for_function("document.querySelector('#cmp-table').innerText.includes('ngram')",
                           timeout=120_000)
    cells = page.inner_text("#cmp-table")
    assert "ar" in cells and "ngram" in cells and "eagle1" not in cells
    page.wait_for_selector("#cmp-chart .js-plotly-plot")     # drawn just after the table
    shot(page, "compare")


def test_replay_a_demo_trace(page):
    page.get_by_role("tab", name="Replay").click()
    page.locator("#rp-pick input").click()
    page.get_by_role("option", name="ngram-copy-list.jsonl").click()
    page.wait_for_selector("#rp-message:has-text('totals re-checked')")
    page.wait_for_selector("#rp-tree .js-plotly-plot")
    assert page.locator("#rp-metrics .sv-card").count() == 4
    shot(page, "replay")


def test_learn_walkthrough_steps(page):
    page.get_by_role("tab", name="Learn").click()
    page.locator("#learn-pick input").click()
    page.get_by_role("option", name="N-gram drafting, greedy: copying a list").click()
    page.wait_for_selector("#learn-header:has-text('Slide 0')")
    page.click("#learn-next")
    page.wait_for_selector("#learn-header:has-text('Slide 1')")
    assert "Verify" in page.inner_text("#learn-narration")
    page.click("#learn-next")
    page.wait_for_selector("#learn-header:has-text('Slide 2')")
    page.click("#learn-prev")
    page.wait_for_selector("#learn-header:has-text('Slide 1')")
    shot(page, "learn")
    page.locator("#learn-pick input").click()
    page.get_by_role("option", name=re.compile("^DSpark")).click()
    page.wait_for_selector("#learn-header:has-text('Slide 0')")
    page.click("#learn-next")
    page.wait_for_selector("#learn-header:has-text('Slide 1')")
    assert "below the threshold" in page.inner_text("#learn-narration") or \
        "stays at or above the threshold" in page.inner_text("#learn-narration")
    page.wait_for_selector("#learn-confidence .js-plotly-plot")
    shot(page, "learn-dspark")


def test_models_and_guide(page):
    page.get_by_role("tab", name="Models & guide").click()
    page.wait_for_selector("#guide-models:has-text('Loaded target')")
    assert "ngram" in page.inner_text("#guide-models")
    assert "lossless" in page.inner_text("#guide-strategies")
    page.wait_for_selector("#guide-cost .js-plotly-plot")   # the measured verify-cost curve
    assert "What verifying costs here" in page.inner_text("#guide-cost")
    byo = page.inner_text("#guide-byo")
    assert "Bring your own" in byo and "z-lab/Qwen3-4B-DFlash-b16" in byo
    assert "python -m specviz export eagle3" in byo and "--speculative-config" in byo
    shot(page, "guide")


# Four users at once: distinct marker words per prompt, so a page showing another session's
# prompt or output is caught by name. (strategy, max new tokens, words to repeat)
SESSIONS = [("ar", 16, "Mercury Venus Jupiter Saturn"), ("ngram", 18, "violin cello flute oboe"),
            ("ngram", 20, "Lisbon Madrid Vienna Prague"), ("ar", 22, "maple birch willow cedar")]
OUTPUT_JS = """() => [...document.querySelectorAll('#pg-tokens .sv-tokens > .sv-tok')]
                     .map(s => s.textContent).join('')"""


def tile(paths: list[Path], out: Path) -> None:
    """Screenshots side by side in a 2-column grid, one PNG."""
    from PIL import Image
    ims = [Image.open(p) for p in paths]
    w, h = max(i.width for i in ims), max(i.height for i in ims)
    grid = Image.new("RGB", (2 * w, h * ((len(ims) + 1) // 2)), "white")
    for k, im in enumerate(ims):
        grid.paste(im, ((k % 2) * w, (k // 2) * h))
    grid.save(out)


def test_four_simultaneous_sessions(browser, app_url, tmp_path):
    gradio_client = pytest.importorskip("gradio_client")
    pages = [open_page(browser, app_url, context=True, width=1000, height=900) for _ in SESSIONS]
    prompts = [f"Repeat exactly, once: {words}." for _, _, words in SESSIONS]
    for pg, (strategy, n, _), prompt in zip(pages, SESSIONS, prompts):
        open_settings(pg)
        pick_strategy(pg, strategy)
        pg.locator("#pg-prompt textarea").fill(prompt)
        pg.locator("#pg-max-new input").fill(str(n))
    t0 = time.perf_counter()
    for pg in pages:                              # all four press Run within a fraction of a second
        pg.click("#pg-run")
    for pg in pages:
        pg.wait_for_selector("#pg-metrics .sv-status:has-text('finished')", timeout=120_000)
    wall = time.perf_counter() - t0

    client = gradio_client.Client(app_url, verbose=False)
    for k, (pg, (strategy, n, words), prompt) in enumerate(zip(pages, SESSIONS, prompts)):
        text, m = client.predict(prompt, strategy, n, 0.0, 0, api_name="/speculate")
        shown = " ".join(pg.inner_text(sel) for sel in ("#pg-tokens", "#pg-metrics",
                                                        "#pg-message"))
        assert prompt in shown, f"session {k} lost its prompt"
        assert f"for {m['new_tokens']} tokens" in pg.inner_text("#pg-metrics")
        assert " ".join(pg.evaluate(OUTPUT_JS).replace("<|im_end|>", "").split()) == \
            " ".join(text.split()), f"session {k} shows another output"
        for other_k, (_, _, other) in enumerate(SESSIONS):
            if other_k != k:
                leaked = [w for w in other.split() if w in shown]
                assert not leaked, f"session {k} shows session {other_k}'s words {leaked}"
    parts = []
    for k, pg in enumerate(pages):
        parts.append(tmp_path / f"session{k}.png")
        pg.locator("#pg-tokens").scroll_into_view_if_needed()
        pg.screenshot(path=str(parts[-1]))
        pg.context.close()
    tile(parts, SHOTS / "four-sessions.png")
    assert wall < 90, f"four short runs took {wall:.0f} s"


def test_serving_two_policies(page):
    page.get_by_role("tab", name="Serving").click()
    page.locator("#srv-requests input[type=number]").fill("2")
    page.locator("#srv-max-new input").fill("6")
    for sel, policy in (("#srv-policy-a", "dspark"), ("#srv-policy-b", "fixed:2")):
        page.locator(f"{sel} input").click()
        page.locator(sel).get_by_role("option", name=policy, exact=True).click()
    page.locator("#srv-check input").check()          # each request against its own ar
    page.click("#srv-run")
    page.wait_for_function("document.querySelector('#srv-table').innerText.includes('fixed:2')",
                           timeout=180_000)
    assert "error" not in page.inner_html("#srv-message")
    for lanes, policy in (("#srv-lanes-a", "dspark"), ("#srv-lanes-b", "fixed:2")):
        assert page.locator(f"{lanes} .sv-serve-lane").count() == 2
        assert f"policy {policy}" in page.inner_text(lanes)
        assert page.inner_text(lanes).count("finished (") == 2
    assert "calibrated" in page.inner_text("#srv-lanes-a")
    rows = page.inner_text("#srv-table")
    assert "dspark" in rows and "fixed:2" in rows
    matches = page.evaluate("""() => [...document.querySelectorAll(
        '#srv-table [aria-colindex="7"]:not(th)')].map(c => c.innerText.trim())""")
    assert matches == ["1.00", "1.00"]          # greedy: every request equals its own ar
    for chart in ("#srv-budget-a", "#srv-budget-b", "#srv-sps", "#srv-compare"):
        page.wait_for_selector(f"{chart} .js-plotly-plot")
    assert "verify budget per step" in page.inner_text("#srv-budget-a")
    assert "operating point" in page.inner_text("#srv-sps")
    shot(page, "serving")
