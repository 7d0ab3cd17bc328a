"""llama.cpp's chat UI at ``/`` in a real browser, answered by the real model through Corral.

The UI is the one embedded in the llama-server binary (``api/chat_ui.py``); its model picker
reads ``/v1/models``, its messages carry ``X-Conversation-Id``, and after a reload it finds its
unfinished answer with ``POST /v1/streams/lookup`` and resumes it from ``GET /v1/stream``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from node_agent.demo_models import DEMO_MODELS, write_model
from node_agent.real_model import MODEL_NAME
from tests.integration.test_status_page import ARTIFACTS, browser_page  # noqa: F401

ANSWER = '[aria-label="Assistant message with actions"]'
UI_TIMEOUT = 120_000  # ms: the UI's bundle is 9 MB of script, slow to start on a busy machine
# The UI's own settings (its localStorage key): greedy decoding and a system prompt make the real
# model's answer reproducible (test_real_model.py asks the same way).
SETTINGS = '{"temperature": 0, "systemMessage": "You are a helpful assistant."}'


def send(page: Any, text: str) -> None:
    page.fill("textarea", text)
    page.get_by_role("button", name="Send").click()


# The text of the ``index``-th answer: its paragraphs, without the model name and token counts
# the UI shows under it.
CONTENT = (
    "(index) => Array.from(document.querySelectorAll('" + ANSWER + "')[index]"
    "?.querySelectorAll('p') ?? []).map((p) => p.innerText).join('\\n').trim()"
)


def answer_text(page: Any, index: int) -> str:
    text: str = page.evaluate(CONTENT, index)
    return text


def wait_answer(page: Any, index: int, condition: str) -> None:
    """Wait until ``condition`` (JS, on ``text``) holds for the ``index``-th answer."""
    page.wait_for_function(
        f"(index) => {{ const text = ({CONTENT})(index); return {condition}; }}",
        arg=index,
        timeout=UI_TIMEOUT,
    )


@pytest.fixture
def models_dir(real_model: Path, tmp_path: Path) -> Path:
    """The real model beside demo-tiny: the picker has a choice to make."""
    folder = tmp_path / "models"
    folder.mkdir()
    os.link(real_model, folder / f"{MODEL_NAME}.gguf")
    tiny = next(m for m in DEMO_MODELS if m.file_name == "demo-tiny.gguf")
    write_model(folder / tiny.file_name, tiny)
    return folder


@pytest.mark.timeout(400)
def test_chat_in_llamas_ui_and_resume_after_a_reload(
    start_agent: Any,
    models_dir: Path,
    browser_page: Any,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent = start_agent("--models-dir", str(models_dir), "-c", "2048")
    page = browser_page
    page.set_default_timeout(UI_TIMEOUT)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    streams: list[Any] = []
    page.on("response", lambda r: "/v1/stream?" in r.url and streams.append(r))

    page.add_init_script(f"localStorage.setItem('LlamaUi.config', '{SETTINGS}')")
    page.goto(agent.url + "/")
    page.wait_for_selector("textarea")
    # The status page is linked from the UI.
    assert page.locator('a[href="/ui"]').inner_text() == "Corral status"
    # Pick the real model in the UI's model picker.
    page.get_by_role("button", name=re.compile("demo-tiny|smollm2|Select model")).first.click()
    page.get_by_role("option").filter(has_text="smollm2").click()
    send(page, "What is the capital of France?")
    wait_answer(page, 0, "text.includes('Paris')")
    assert agent.state(MODEL_NAME) == "loaded"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat-ui.png"))

    # A long answer, and a reload while it is written.
    send(page, "Write a long story about a dragon who learns to cook.")
    wait_answer(page, 1, "text.length > 60")
    before = answer_text(page, 1)
    page.reload()
    # The reloaded page finds the unfinished answer and replays it from the child's buffer.
    wait_answer(page, 1, f"text.length > {len(before)}")
    after = answer_text(page, 1)
    assert after.startswith(before), (before, after)
    assert [r.status for r in streams] and all(r.status == 200 for r in streams), streams
    assert "from=0" in streams[0].url
    shot = ARTIFACTS / "chat-ui-resumed.png"
    page.screenshot(path=str(shot))
    with capsys.disabled():  # shown in CI's log, not captured
        print(f"\nchat UI screenshots: {ARTIFACTS / 'chat-ui.png'}, {shot}")
    assert not errors, errors


@pytest.mark.timeout(300)
def test_the_demos_chat_opens_on_the_real_model_after_a_generated_one_answered(
    start_agent: Any,
    models_dir: Path,
    browser_page: Any,  # noqa: F811
) -> None:
    """hack/demo.sh's presets (``corral demo-models DIR --presets FILE``): llama.cpp's UI opens
    on the first *loaded* model it lists, and demo-tiny sorts before smollm2: once demo-tiny
    had answered, ``/`` opened on it (word salad)."""
    import subprocess
    import sys

    presets = models_dir / "demo-presets.ini"
    subprocess.run(
        [sys.executable, "-m", "node_agent.cli", "demo-models", str(models_dir), "--presets",
         str(presets)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    agent = start_agent(
        "--models-dir", str(models_dir), "--models-preset", str(presets), "--models-max", "2",
        "-c", "2048",
    )  # fmt: skip
    agent.wait_state(MODEL_NAME, "loaded", timeout=60)
    status, body = agent.post(
        "/v1/chat/completions",
        {"model": "demo-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200, body
    # The generated model goes once it has answered (it loads again in milliseconds); the
    # real one stays (pinned).
    agent.wait_state("demo-tiny", "unloaded", timeout=15)
    assert agent.state(MODEL_NAME) == "loaded"
    page = browser_page
    page.set_default_timeout(UI_TIMEOUT)
    page.goto(agent.url + "/")
    picker = page.get_by_role("button", name=re.compile("demo-tiny|smollm2|Select model")).first
    page.wait_for_function(
        "() => [...document.querySelectorAll('button')].some(b => /smollm2|demo-tiny/i"
        ".test(b.innerText))"
    )
    assert "smollm2" in picker.inner_text().lower(), picker.inner_text()
    # demo-tiny is still there to pick.
    picker.click()
    assert page.get_by_role("option").filter(has_text="demo-tiny").count() == 1
