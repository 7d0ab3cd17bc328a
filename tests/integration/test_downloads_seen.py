"""Downloads as a user sees them (issue 49, items 2-6): ``corral pull`` of a download already on
its way, the sources not re-read while a partial file grows, a download that is no running
instance, what the log and ``corral pull`` say when the agent stops, the bar's bytes, speed
and time left, and ``corral rm`` leaving no empty folder. A real agent downloading from the
local hub (``hf_server``), ``corral`` run as the user runs it."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import REPO, AgentProcess, wait_until
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.test_cli_client import corral

REPO_NAME = "corral-test/small"
NAME = f"{REPO_NAME}:Q8_0"


@pytest.fixture
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    # demo-small: 5.6 MB, 342 pieces of 16 KiB when paced
    server.add(REPO_NAME, {"small-Q8_0.gguf": (demo_dir / "demo-small.gguf").read_bytes()})
    yield server
    server.close()


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    return tmp_path / "hf"


@pytest.fixture
def agent(
    start_agent: Any, demo_dir: Path, tmp_path: Path, hub: HubServer, hf_home: Path
) -> AgentProcess:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(demo_dir / "demo-tiny.gguf", folder)
    env = {
        "HF_HOME": str(hf_home),
        "MODEL_ENDPOINT": hub.url + "/",
        "LLAMA_CACHE": "",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    started: AgentProcess = start_agent("--models-dir", str(folder), "-c", "512", env=env)
    return started


def downloading(agent: AgentProcess) -> None:
    status, body = agent.post("/models", {"model": NAME})
    assert status == 200, body
    wait_downloading(agent)


def wait_downloading(agent: AgentProcess) -> None:
    def listed() -> bool:
        entry = agent.models().get(NAME)
        return entry is not None and entry["status"]["value"] == "downloading"

    wait_until(listed, f"{NAME} downloading", timeout=20)


def test_pull_follows_a_download_already_on_its_way(agent: AgentProcess, hub: HubServer) -> None:
    hub.pace = 0.01  # some 4 s
    downloading(agent)
    pulled = corral("pull", NAME, url=agent.url)
    assert pulled.returncode == 0, pulled.stderr
    lines = pulled.stdout.splitlines()
    assert lines[-1].startswith(f"{NAME} downloaded in "), lines
    assert agent.state(NAME) == "unloaded"  # a cache model now, not loaded


def test_a_growing_download_does_not_re_read_the_sources(
    agent: AgentProcess, hub: HubServer
) -> None:
    hub.pace = 0.01
    downloading(agent)
    wait_until(lambda: agent.state(NAME) != "downloading", "the download's end", timeout=60)
    log = agent.log()
    after = log[log.index(f"model={NAME}: downloading") :]
    # Once the files are in place the agent re-reads its sources (the new model: "1 added").
    # Before that, the download's first folders in the cache are one change (the hub folder
    # itself here, a new repository's folder); the partial file growing for 4 s is none.
    end = after.find("reloaded: 1 added")
    assert end != -1, after[-2000:]
    reloads = [line for line in after[:end].splitlines() if "reloaded:" in line]
    assert len(reloads) <= 1, reloads


def test_a_download_is_no_running_instance(agent: AgentProcess, hub: HubServer) -> None:
    hub.hold(1 << 20)  # 1 MiB, then it waits
    downloading(agent)
    shown = corral("status", url=agent.url)
    assert shown.returncode == 0, shown.stderr
    assert "instances  0 running of 4" in shown.stdout, shown.stdout


def test_the_shutdown_says_a_download_will_resume(agent: AgentProcess, hub: HubServer) -> None:
    hub.hold(1 << 20)
    downloading(agent)
    agent.stop()
    log = agent.log()
    assert "download cancelled" not in log, log[-2000:]
    assert f"model={NAME}: download stopped by the shutdown; it resumes" in log, log[-2000:]


def _under_a_terminal(*args: str, url: str) -> tuple[subprocess.Popen[bytes], int]:
    """``corral ARGS`` with its stdout and stderr on one pseudo-terminal, as in a shell."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "LLAMA_"))}
    env["CORRAL_URL"] = url
    proc = subprocess.Popen(
        [sys.executable, "-m", "node_agent.cli", *args],
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
    )
    os.close(slave)
    return proc, master


def _read_all(master: int, proc: subprocess.Popen[bytes], until: float) -> bytes:
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                piece = os.read(master, 4096)
            except OSError:  # the other side closed
                break
            if not piece:
                break
            out += piece
        elif proc.poll() is not None:
            break
    return out


def test_pull_says_on_a_line_of_its_own_that_the_download_resumes(
    agent: AgentProcess, hub: HubServer
) -> None:
    hub.hold(1 << 20)
    proc, master = _under_a_terminal("pull", NAME, url=agent.url)
    try:
        wait_downloading(agent)
        seen = b""
        deadline = time.monotonic() + 20
        while b"%" not in seen and time.monotonic() < deadline:
            seen += _read_all(master, proc, time.monotonic() + 0.5)
        assert b"%" in seen, seen  # the bar is drawn
        os.kill(agent.proc.pid, signal.SIGKILL)  # the agent goes away under the bar
        seen += _read_all(master, proc, time.monotonic() + 30)
        assert proc.wait(timeout=30) == 3
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = seen.decode(errors="replace")
    at = text.index("cannot reach the agent")
    # The bar's line is ended (or cleared) before the message, which says what happens next.
    bar = text.rfind("\rdownloading", 0, at)  # the bar's last drawing
    after_bar = text[bar + 1 : at]
    assert bar != -1 and ("\n" in after_bar or "\r\x1b[K" in after_bar), repr(text[-300:])
    said = text[at:]
    assert "resumes" in said and f"corral pull {NAME}" in said, said


def test_pull_shows_bytes_speed_and_time_left(agent: AgentProcess, hub: HubServer) -> None:
    hub.pace = 0.01
    pulled = corral("pull", NAME, url=agent.url)
    assert pulled.returncode == 0, pulled.stderr
    bars = [line for line in pulled.stdout.splitlines() if line.startswith("downloading ")]
    size = r"\d+(\.\d)? (B|KiB|MiB|GiB)"
    pattern = re.compile(rf"{size} of {size}, {size}/s, \d+(m \d\ds|s) left$")
    middle = [line for line in bars if "100%" not in line and "  0%" not in line]
    assert middle and all(pattern.search(line) for line in middle), bars
    assert re.search(rf"100% {size} of {size}$", bars[-1]) or pattern.search(bars[-1]), bars


def test_rm_leaves_no_empty_repository_folder(
    agent: AgentProcess, hub: HubServer, hf_home: Path
) -> None:
    assert corral("pull", NAME, url=agent.url).returncode == 0
    folder = hf_home / "hub" / "models--corral-test--small"
    assert folder.is_dir()
    removed = corral("rm", NAME, url=agent.url)
    assert removed.returncode == 0, removed.stderr
    assert not folder.exists(), sorted(str(p) for p in folder.rglob("*"))


def test_rm_keeps_a_repository_folder_that_holds_another_model(
    agent: AgentProcess, hub: HubServer, hf_home: Path, demo_dir: Path
) -> None:
    hub.add(
        REPO_NAME,
        {
            "small-Q8_0.gguf": (demo_dir / "demo-small.gguf").read_bytes(),
            "small-F16.gguf": (demo_dir / "demo-tiny.gguf").read_bytes(),
        },
    )
    assert corral("pull", NAME, url=agent.url).returncode == 0
    assert corral("pull", f"{REPO_NAME}:F16", url=agent.url).returncode == 0
    assert corral("rm", NAME, url=agent.url).returncode == 0
    assert f"{REPO_NAME}:F16" in agent.models()
    assert (hf_home / "hub" / "models--corral-test--small").is_dir()


def test_logs_of_a_model_that_never_started_says_so(agent: AgentProcess) -> None:
    logs = corral("logs", "demo-tiny", url=agent.url)
    assert logs.returncode == 1, (logs.stdout, logs.stderr)
    assert logs.stdout == ""
    assert "demo-tiny has not started since the agent did" in logs.stderr
    assert "corral load demo-tiny" in logs.stderr
