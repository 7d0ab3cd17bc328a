"""``corral ps|logs|pull|rm|reload`` against a real agent, run as the user runs them (issue 29)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, wait_until
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.test_cli_client import corral

TINY = "demo-tiny"
REPO = "corral-test/tiny"


@pytest.fixture
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add(REPO, {"tiny-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes()})
    yield server
    server.close()


@pytest.fixture
def agent(start_agent: Any, demo_dir: Path, tmp_path: Path, hub: HubServer) -> AgentProcess:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(demo_dir / f"{TINY}.gguf", folder)
    env = {"HF_HOME": str(tmp_path / "hf"), "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}
    started: AgentProcess = start_agent(
        "--models-dir", str(folder), "-c", "512", "--models-ttl", "10m", env=env
    )
    return started


def test_ps_shows_memory_device_time_until_unload_and_pin(agent: AgentProcess) -> None:
    empty = corral("ps", url=agent.url)
    assert (empty.returncode, empty.stdout.strip()) == (0, "no model is running")
    assert corral("load", TINY, url=agent.url).returncode == 0
    shown = corral("ps", url=agent.url)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "STATE",
        "MEMORY",
        "DEVICE",
        "UNLOAD",
        "IN",
        "PIN",
        "IN",
        "FLIGHT",
    ]
    cells = row.split()
    # demo-tiny, loaded, "N.N MiB" (the process's own figure: the ledger is off), host,
    # "9m 5Ns" (--models-ttl 10m), no pin, nothing in flight.
    assert cells[:2] == [TINY, "loaded"] and cells[3] == "MiB" and float(cells[2]) > 0, row
    assert cells[4] == "host" and cells[5] == "9m" and cells[7:] == ["-", "0"], row


def test_logs_prints_the_childs_lines(agent: AgentProcess) -> None:
    assert corral("load", TINY, url=agent.url).returncode == 0

    def printed() -> bool:
        logs = corral("logs", TINY, "-n", "50", url=agent.url)
        assert logs.returncode == 0, logs.stderr
        return "llama_server: model loaded" in logs.stdout

    # llama-server logs "model loaded" just after its /health turns ready (server.cpp), and
    # the agent reads a trickle of log lines at most every 0.25 s: it may come after the load.
    wait_until(printed, "the child's 'model loaded' line in corral logs", timeout=10)
    unknown = corral("logs", "nope", url=agent.url)
    assert unknown.returncode == 1 and "model 'nope' not found" in unknown.stderr


def test_pull_with_progress_then_rm(agent: AgentProcess) -> None:
    pulled = corral("pull", f"{REPO}:Q8_0", url=agent.url)
    assert pulled.returncode == 0, pulled.stderr
    lines = pulled.stdout.splitlines()
    # Not a TTY: a line per tenth of the download, then the outcome.
    assert lines[0] == f"downloading {REPO}:Q8_0 [..........]   0%", lines
    # Then its bytes, speed and time left (test_downloads_seen.py holds them to a pattern).
    full = [line for line in lines if line.startswith(f"downloading {REPO}:Q8_0 [##########] 100%")]
    assert full == [f"downloading {REPO}:Q8_0 [##########] 100% 946.8 KiB of 946.8 KiB"], lines
    assert lines[-1].startswith(f"{REPO}:Q8_0 downloaded in "), lines
    assert f"{REPO}:Q8_0" in agent.models()
    again = corral("pull", f"{REPO}:Q8_0", url=agent.url)
    assert (again.returncode, again.stdout.strip()) == (0, f"{REPO}:Q8_0 is already downloaded")
    removed = corral("rm", f"{REPO}:Q8_0", url=agent.url)
    assert removed.returncode == 0, removed.stderr
    assert f"{REPO}:Q8_0" not in agent.models()


def test_reload_picks_up_a_new_file(agent: AgentProcess, demo_dir: Path, tmp_path: Path) -> None:
    shutil.copy(demo_dir / "demo-small.gguf", tmp_path / "models")
    reloaded = corral("reload", url=agent.url)
    assert (reloaded.returncode, reloaded.stdout.strip()) == (0, "reloaded: 2 models")
    assert "demo-small" in agent.models()
