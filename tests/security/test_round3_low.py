"""Issue 50 (security round 3), row 8 (low): a pull that did make a model, a ``file://``
redirect, one preset's alias clash, and what ``--routing-metrics-port`` shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import ollama
import pytest

from tests.integration.harness import AgentProcess, http
from tests.integration.hf_server import HubServer
from tests.integration.test_cli_ops import REPO, hub  # a hub serving demo-tiny as REPO

__all__ = ["hub"]  # (a fixture: pytest finds it by its name here)


@pytest.mark.parametrize("pulled", [REPO, f"hf.co/{REPO}", f"{REPO}:q8_0"])
def test_a_pull_that_made_a_model_succeeds_and_the_name_serves(
    start_agent: Any, hub: HubServer, tmp_path: Path, pulled: str
) -> None:
    """It answered 500 "the download made no model" for a name without its tag (or with the
    tag in lower case), though the download made ``corral-test/tiny:Q8_0``."""
    env = {"HF_HOME": str(tmp_path / "hf"), "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}
    agent: AgentProcess = start_agent("-c", "512", env=env)
    client = ollama.Client(host=agent.url, timeout=120)
    try:
        assert client.pull(pulled, stream=False).status == "success"
        assert f"{REPO}:Q8_0" in agent.models()
        answer = client.generate(model=pulled, prompt="hi", options={"num_predict": 4})
        assert answer.done
    finally:
        client.close()


def test_a_redirect_to_a_file_url_says_what_it_is(
    start_agent: Any, hub: HubServer, tmp_path: Path, demo_dir: Path
) -> None:
    """It was refused as "another host (None)"."""
    hub.redirect = "file:///etc/passwd#"
    ini = tmp_path / "presets.ini"
    url = f"{hub.url}/{REPO}/resolve/main/tiny-Q8_0.gguf"
    ini.write_text(f"[m]\nmodel-url = {url}\nmodel-sha256 = {'0' * 64}\n")
    agent: AgentProcess = start_agent(
        "--models-preset", str(ini), "-c", "512", env={"LLAMA_CACHE": str(tmp_path / "c")}
    )
    status, body = http(
        "POST", agent.url + "/v1/chat/completions",
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )  # fmt: skip
    assert status == 500, body
    reason = str(body["error"])
    assert "None" not in reason and "a file:// URL" in reason, reason


def test_one_presets_alias_clash_fails_only_that_preset(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    """It made every later reload of any source fail until it was fixed (17 ERROR lines)."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "demo-tiny.gguf").symlink_to(demo_dir / "demo-tiny.gguf")
    ini = tmp_path / "presets.ini"
    ini.write_text(f"[p]\nmodel = {demo_dir / 'demo-small.gguf'}\nc = 512\n")
    agent: AgentProcess = start_agent("--models-dir", str(folder), "--models-preset", str(ini))
    ini.write_text(f"[p]\nmodel = {demo_dir / 'demo-small.gguf'}\nalias = demo-tiny\n")
    status, body = http("GET", agent.url + "/models?reload=1")
    assert status == 200, body
    assert [r["models"] for r in body.get("refused", [])] == [["p"]], body.get("refused")
    for i in range(5):  # later reloads of other sources go through
        (folder / f"extra-{i}.gguf").symlink_to(demo_dir / "demo-medium.gguf")
        status, body = http("GET", agent.url + "/models?reload=1")
        assert status == 200, body
        assert f"extra-{i}" in {m["id"] for m in body["data"]}
    assert agent.log().count("ERROR") == 1, agent.log()[-3000:]
    assert http("POST", agent.url + "/v1/chat/completions", {
        "model": "demo-tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
    })[0] == 200  # fmt: skip


def test_the_routing_metrics_flag_says_it_shows_model_names_without_a_key() -> None:
    """Documented in docs/inference-pool.md only: the flag's own help now says it too."""
    shown = subprocess.run(
        [sys.executable, "-m", "node_agent.cli", "agent", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    text = " ".join(shown.stdout.split())
    assert "No key is asked there: whoever reaches the port sees the names of the loaded" in text
