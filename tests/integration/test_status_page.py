"""The status page in a real headless browser (Debian's chromium driven by playwright)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.harness import REPO, chat, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# TESTING.md "A real browser": these flags make Debian's chromium run headless in a container.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "artifacts"
TINY, SMALL = "demo-tiny", "demo-small"


@pytest.fixture
def browser_page() -> Any:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            "chromium is not installed (hack/setup.sh installs it: apt-get install chromium)"
        )
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            yield page
        finally:
            browser.close()


def row(page: Any, model: str) -> Any:
    return page.locator(f'#models tr[data-model="{model}"]')


def wait_for_recent(page: Any, text: str) -> None:
    """Wait until the page's recent events show ``text``. The page reads ``GET /models`` and
    ``GET /ui/recent`` together, and the agent adds an event to the latter a moment after the
    model's state changed, so one read can show a row's new state without its event: the
    event's own notice brings a second read 80 ms later."""
    page.wait_for_function(
        "text => document.querySelector('#recent').innerText.includes(text)", arg=text
    )


def test_status_page_shows_models_and_loads_one_live(
    start_agent: Any, demo_dir: Path, browser_page: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-max", "1", "-c", "1024",
        "--models-memory-margin", "64", "--memory-limit", "host=1GiB",
    )  # fmt: skip
    assert agent.post("/v1/chat/completions", chat(SMALL))[0] == 200  # something to show
    page = browser_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(agent.url + "/ui")  # "/" is llama.cpp's chat UI (test_chat_ui.py)
    page.wait_for_selector("#live.on")  # the events stream is open
    for model in (TINY, SMALL, "demo-medium"):
        assert row(page, model).count() == 1
    assert row(page, SMALL).get_attribute("data-state") == "loaded"
    assert row(page, TINY).get_attribute("data-state") == "unloaded"
    wait_for_recent(page, "loaded in")
    # The ledger is on: one bar for the host, and small holds memory in it.
    page.wait_for_selector('#memory .device[data-device="host"]')
    assert SMALL in page.locator("#memory").inner_text()
    # The bar's legend says what its other parts are, with their sizes.
    legend = page.locator('#memory .device[data-device="host"] .legend')
    assert legend.locator("[data-part=other]").inner_text().startswith("other processes ")
    assert legend.locator("[data-part=available]").inner_text().startswith("available ")
    assert legend.locator("[data-part=margin]").inner_text() == "margin kept free 64.0 MiB"
    summary = page.locator("#summary").inner_text()
    assert summary == "3 models · 1 of 1 instances running · 0 waiting"

    # A marker on window survives only if the page is never reloaded.
    page.evaluate("window.__sameDocument = true")
    row(page, TINY).locator("button[data-action=load]").click()
    page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="loaded"]', timeout=20000)
    # --models-max 1: loading tiny evicted small, and the page saw that too.
    page.wait_for_selector(f'#models tr[data-model="{SMALL}"][data-state="unloaded"]')
    page.wait_for_function(f"document.querySelector('#memory').innerText.includes('{TINY}')")
    assert page.evaluate("window.__sameDocument") is True
    assert agent.state(TINY) == "loaded"
    wait_for_recent(page, "evicted")
    assert row(page, TINY).locator("button[data-action]").inner_text() == "Unload"

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "status-page.png"
    page.screenshot(path=str(shot), full_page=True)
    with capsys.disabled():  # shown in CI's log, not captured
        print(f"\nstatus page screenshot: {shot}")
    assert not errors, errors


def test_status_page_unload_button(start_agent: Any, demo_dir: Path, browser_page: Any) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "-c", "1024")
    assert agent.post("/models/load", {"model": TINY})[0] == 200
    agent.wait_state(TINY, "loaded")
    page = browser_page
    page.goto(agent.url + "/ui")
    page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="loaded"]')
    row(page, TINY).locator("button[data-action=unload]").click()
    page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="unloaded"]')
    assert agent.state(TINY) == "unloaded"
    wait_for_recent(page, "unloaded on request")


def test_status_page_shows_time_until_unload_process_memory_and_a_models_log(
    start_agent: Any, demo_dir: Path, browser_page: Any
) -> None:
    """Issue 29: TTL and pin were shown nowhere, memory was "–" with the ledger off, and the
    models' logs had no view."""
    agent = start_agent("--models-dir", str(demo_dir), "-c", "1024", "--models-ttl", "10m")
    assert agent.post("/models/load", {"model": TINY})[0] == 200
    agent.wait_state(TINY, "loaded")
    # llama-server logs "model loaded" just after its /health turns ready, and the agent reads
    # a trickle of log lines at most every 0.25 s: the page is opened once the agent has it.
    wait_until(
        lambda: "model loaded" in agent.get(f"/models/logs?model={TINY}")[1],
        "the child's 'model loaded' line in GET /models/logs",
        timeout=10,
    )
    page = browser_page
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(agent.url + "/ui")
    page.wait_for_selector(f'#models tr[data-model="{TINY}"] .until')
    loaded = row(page, TINY)
    assert loaded.locator(".until").inner_text().startswith("unloads in 9m ")
    memory = loaded.locator("td").nth(2).inner_text()
    assert memory.startswith("process ") and memory.endswith("MiB"), memory
    assert row(page, SMALL).locator(".until").count() == 0  # not running: nothing to say
    loaded.locator("button[data-log]").click()
    page.wait_for_selector("#log-section", state="visible")
    assert page.locator("#log-model").text_content() == TINY
    assert "llama_server: model loaded" in page.locator("#log").inner_text()
    page.click("#log-close")
    assert page.locator("#log-section").is_hidden()
    assert not errors, errors


COLUMN_LEFTS = "() => [...document.querySelectorAll('#models th')].map(th => th.offsetLeft)"
LEGEND_HEIGHTS = (
    "() => [...document.querySelectorAll('#memory .legend .key')]"
    ".map(e => e.getBoundingClientRect().height)"
)


def test_status_page_at_420_px_and_columns_that_stay(
    start_agent: Any, demo_dir: Path, browser_page: Any
) -> None:
    """Issue 29: at 420 px the memory panel broke one word per line, and the table's columns
    moved between refreshes."""
    agent = start_agent(
        "--models-dir", str(demo_dir), "--models-memory-margin", "64", "--memory-limit", "host=1GiB"
    )
    page = browser_page
    page.goto(agent.url + "/ui")
    page.wait_for_selector(f'#models tr[data-model="{TINY}"][data-state="unloaded"]')
    before = page.evaluate(COLUMN_LEFTS)
    assert agent.post("/models/load", {"model": TINY})[0] == 200
    page.wait_for_selector(f'#models tr[data-model="{TINY}"] .until')  # new text in the row
    assert page.evaluate(COLUMN_LEFTS) == before

    page.set_viewport_size({"width": 420, "height": 860})
    page.wait_for_selector('#memory .device[data-device="host"]')
    heights = page.evaluate(LEGEND_HEIGHTS)
    assert heights and max(heights) < 30, heights  # each key on one line (~17 px)


def test_status_page_asks_for_the_api_key(
    start_agent: Any, demo_dir: Path, browser_page: Any
) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--api-key", "sekret")
    page = browser_page
    page.goto(agent.url + "/ui")  # the page itself holds no data: it needs no key
    page.wait_for_selector("#keyform", state="visible")
    page.wait_for_selector("#notice", state="visible")
    assert page.locator("#notice").inner_text() == "the agent wants an API key"
    page.fill("#key-input", "sekret")
    page.click("#key button")
    page.wait_for_selector(f'#models tr[data-model="{TINY}"]')
    page.wait_for_selector("#live.on")
    # The read that showed the models cleared the banner that asked for the key.
    assert not page.locator("#notice").is_visible()


# Records, in the page, how many model rows there were when "live" first lit up.
RECORD_LIVE = """
document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  new MutationObserver(() => {
    if (live.classList.contains("on") && window.__rowsWhenLive === undefined) {
      window.__rowsWhenLive = document.querySelectorAll("#models tr[data-model]").length;
    }
  }).observe(live, { attributes: true });
});
"""


def test_status_page_without_the_ledger(
    start_agent: Any, demo_dir: Path, browser_page: Any
) -> None:
    agent = start_agent("--models-dir", str(demo_dir))  # no --models-memory-margin: ledger off
    page = browser_page
    asked: list[str] = []
    page.on("request", lambda request: asked.append(urlsplit(request.url).path))
    page.add_init_script(RECORD_LIVE)
    slowed: list[bool] = []

    def slow_first_list(route: Any) -> None:
        # The first GET /models answers late: the events stream opens well before it.
        if not slowed:
            slowed.append(True)
            time.sleep(1.5)
        route.continue_()

    page.route("**/models", slow_first_list)
    page.goto(agent.url + "/ui")
    page.wait_for_selector("#live.on")
    # "live" lit up only once the models were on the page, not when the stream opened.
    assert page.evaluate("window.__rowsWhenLive") == 3
    summary = page.locator("#summary").inner_text()
    assert summary == "3 models · 0 of 4 instances running · 0 waiting"
    assert page.locator("#memory-section").is_hidden()

    # Wait for two rounds of the page's 3-second poll, then count: /ledger answered 404 once,
    # and the page never asked again.
    deadline = time.monotonic() + 60
    while asked.count("/models") < 4:
        assert time.monotonic() < deadline, asked
        page.wait_for_timeout(200)
    assert asked.count("/ledger") == 1, asked


def test_status_page_runs_under_its_content_security_policy(
    start_agent: Any, demo_dir: Path, browser_page: Any
) -> None:
    # Issue 16, row 14: the page's own script (by hash) runs, nothing else; no site may frame it.
    agent = start_agent("--models-dir", str(demo_dir))
    page = browser_page
    violations: list[str] = []
    page.on(
        "console",
        lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    response = page.goto(agent.url + "/ui")
    headers = response.headers
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    policy = headers["content-security-policy"]
    assert "script-src 'sha256-" in policy and "frame-ancestors 'none'" in policy
    page.wait_for_selector("#live.on")  # the script ran: the events stream is open
    assert row(page, TINY).count() == 1
    # a script the page did not ship is refused
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__injected = true'; document.body.appendChild(s); }"
    )
    assert page.evaluate("window.__injected === undefined")
    assert any("script" in v for v in violations), violations


def test_status_page_shows_a_download_as_one_and_cancels_it(
    start_agent: Any, demo_dir: Path, tmp_path: Path, browser_page: Any
) -> None:
    from tests.integration.hf_server import start_hub

    hub = start_hub()
    try:
        hub.add(
            "corral-test/small", {"small-Q8_0.gguf": (demo_dir / "demo-small.gguf").read_bytes()}
        )
        hub.hold(1 << 20)  # 1 MiB of 5.6, then it waits
        env = {"HF_HOME": str(tmp_path / "hf"), "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}
        agent = start_agent("--models-dir", str(demo_dir), "-c", "512", env=env)
        name = "corral-test/small:Q8_0"
        assert agent.post("/models", {"model": name})[0] == 200
        page = browser_page
        page.goto(agent.url + "/ui")
        page.wait_for_selector(f'#models tr[data-model="{name}"][data-state="downloading"]')
        pill = row(page, name).locator(".pill")
        assert pill.inner_text() == "downloading"
        # Readable: a colour of its own behind the white text, as every other state has.
        background = pill.evaluate("e => getComputedStyle(e).backgroundColor")
        assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
        # A download is no running instance; what it offers is to cancel it.
        assert page.locator("#summary").inner_text().startswith("4 models · 0 of 4 instances")
        button = row(page, name).locator("button[data-action]")
        assert (button.get_attribute("data-action"), button.inner_text()) == ("cancel", "Cancel")
        button.click()
        page.wait_for_selector(f'#models tr[data-model="{name}"]', state="detached")
        assert name not in agent.models()
    finally:
        hub.close()
