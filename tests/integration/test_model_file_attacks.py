"""Issue 26, rows 6, 8 and 12, against a real agent: nothing a model file or a hub listing holds
may freeze the agent or break its list of models.

Row 6: a 4 KB GGUF claiming 20,000,000 layers in ``--models-dir`` with the ledger on froze
``GET /models`` for minutes (RSS 1.27 GB). Row 8: one whose layer count is the float ``inf``
made ``/models`` and ``/v1/models`` answer 500 for everyone, across restarts. Row 12: a hub
file path holding NUL killed the download task; the model stayed ``downloading`` for good.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.attacks import Probe, status_kib
from tests.integration.harness import AgentProcess, chat, http
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.model_attacks import LEDGER, crafted_gguf

Start = Callable[..., AgentProcess]
MIB = 1 << 20


def ledger_agent(start_agent: Start, *args: str, **kw: Any) -> AgentProcess:
    agent: AgentProcess = start_agent(*args, *LEDGER, **kw)
    return agent


@pytest.fixture
def bad_models(demo_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / "demo-tiny.gguf", folder / "demo-tiny.gguf")
    crafted_gguf(folder / "huge.gguf", block_count=20_000_000)
    crafted_gguf(folder / "inf.gguf", block_count=math.inf)
    return folder


def test_row6_row8_crafted_headers_never_freeze_or_break_the_list(
    start_agent: Start, bad_models: Path
) -> None:
    agent = ledger_agent(start_agent, "--models-dir", str(bad_models))
    time.sleep(0.5)  # the agent's own start-up work (imports in the background) settles
    rss_before = status_kib(agent.proc.pid, "VmRSS")
    probe = Probe(agent.port, agent.proc.pid, interval=0.05)
    slowest = 0.0
    with probe.running():
        end = time.monotonic() + 2
        while time.monotonic() < end:
            for path in ("/models", "/v1/models"):
                start = time.monotonic()
                status, body = agent.get(path, timeout=10)
                slowest = max(slowest, time.monotonic() - start)
                assert status == 200, body
    assert slowest < 2, f"GET /models took {slowest:.2f} s"
    assert max(probe.latencies) < 0.25, probe.summary()
    assert (max(probe.rss_kib) - rss_before) * 1024 < 64 * MIB, probe.summary()

    entries = {m["id"]: m for m in body["data"]}
    assert set(entries) == {"demo-tiny", "huge", "inf"}
    assert "block_count 20000000 is out of range" in entries["huge"]["corral"]["error"]
    assert "block_count must be a whole number" in entries["inf"]["corral"]["error"]
    assert entries["demo-tiny"]["corral"]["memory"]["min"]["host"] > 0
    # the good model serves; the list stays whole after the agent restarts
    assert agent.post("/v1/chat/completions", chat("demo-tiny"))[0] == 200
    agent.stop()
    again = ledger_agent(start_agent, "--models-dir", str(bad_models))
    assert again.get("/v1/models", timeout=10)[0] == 200


# -- through POST /models, from a hub ----------------------------------------------------------


@pytest.fixture
def hub(demo_dir: Path, tmp_path: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add(
        "corral-test/inf",
        {"inf-Q8_0.gguf": crafted_gguf(tmp_path / "i", block_count=math.inf).read_bytes()},
    )
    server.add("corral-test/tiny", {"tiny-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes()})
    server.add(
        "corral-test/nul",
        {
            "nul\x00-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes(),
            "ok-Q4_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes(),
        },
    )
    yield server
    server.close()


@pytest.fixture
def hub_env(tmp_path: Path, hub: HubServer) -> dict[str, str]:
    return {"HF_HOME": str(tmp_path / "hf"), "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}


def test_row8_a_downloaded_inf_model_is_one_model_with_its_reason(
    start_agent: Start, hub_env: dict[str, str]
) -> None:
    agent = ledger_agent(start_agent, env=hub_env)
    assert agent.post("/models", {"model": "corral-test/inf:Q8_0"})[0] == 200
    deadline = time.monotonic() + 30
    while (
        "corral-test/inf:Q8_0" not in agent.models()
        or agent.state("corral-test/inf:Q8_0") == "downloading"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    for path in ("/models", "/v1/models"):
        status, body = agent.get(path, timeout=10)
        assert status == 200, body
    entry = {m["id"]: m for m in body["data"]}["corral-test/inf:Q8_0"]
    assert "block_count must be a whole number" in entry["corral"]["error"]


def test_row12_a_hub_path_with_nul_is_refused_up_front_and_nothing_hangs(
    start_agent: Start, hub_env: dict[str, str]
) -> None:
    agent: AgentProcess = start_agent(env=hub_env)
    for _ in range(2):  # the same answer again: never "already exists"
        status, body = agent.post("/models", {"model": "corral-test/nul:Q8_0"}, timeout=10)
        assert status == 400, body
        assert "lists a file path no file can have" in body["error"]["message"]
        assert "corral-test/nul:Q8_0" not in agent.models()  # not "downloading"
    start = time.monotonic()
    status, _ = agent.get("/models?reload=1", timeout=10)
    assert status == 200
    deleted = http("DELETE", f"{agent.url}/models?model=corral-test/nul:Q8_0", timeout=10)
    assert deleted[0] == 500  # llama.cpp's "not found": nothing was left behind to remove
    assert time.monotonic() - start < 5
    # the agent's downloads still work
    assert agent.post("/models", {"model": "corral-test/tiny:Q8_0"})[0] == 200
    deadline = time.monotonic() + 30
    while agent.models().get("corral-test/tiny:Q8_0", {}).get("status", {}).get("value") in (
        None,
        "downloading",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert agent.post("/v1/chat/completions", chat("corral-test/tiny:Q8_0"))[0] == 200
