"""The memory ledger with real children: evict by memory, never take a busy model's memory.

Three separate copies of the ~50 MB demo model (copies, not links: processes mapping the
same file would share its pages, and each would hold less than its estimate) under a host
limit that fits two of them, with ``--models-max 0`` so memory is the only limit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, chat, wait_until

MIB = 1 << 20
FAKE_TIMING = {"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}  # loads and requests each hold 2 s


@pytest.fixture
def three_models(demo_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("m1", "m2", "m3"):
        shutil.copyfile(demo_dir / "demo-medium.gguf", folder / f"{name}.gguf")
    return folder


def memory_agent(start_agent: Any, folder: Path, limit_mib: int, **kw: Any) -> AgentProcess:
    agent: AgentProcess = start_agent(
        "--models-dir",
        str(folder),
        "--models-max",
        "0",
        "-c",
        "4096",
        "--models-memory-margin",
        "0",
        "--memory-limit",
        f"host={limit_mib}MiB",
        **kw,
    )
    return agent


def running(agent: AgentProcess) -> set[str]:
    return {n for n, m in agent.models().items() if m["status"]["value"] != "unloaded"}


def min_mib(agent: AgentProcess, model: str) -> float:
    figures = agent.models()[model]["corral"]["memory"]
    return float(figures["min"]["host"]) / MIB


def room_for_two(start_agent: Any, folder: Path) -> int:
    """A limit in MiB with room for two of the models (with what the children really hold on
    top of the estimate), not three: read from an agent's own estimate."""
    probe = memory_agent(start_agent, folder, 100_000)
    one = min_mib(probe, "m1")
    probe.stop()
    return int(one * 2.6)


def test_third_model_evicts_the_least_recently_used_by_memory(
    start_agent: Any, three_models: Path
) -> None:
    agent = memory_agent(start_agent, three_models, room_for_two(start_agent, three_models))
    for model in ("m1", "m2"):
        assert agent.post("/v1/chat/completions", chat(model))[0] == 200
    assert running(agent) == {"m1", "m2"}
    assert agent.post("/v1/chat/completions", chat("m1"))[0] == 200  # m2 is now the LRU
    assert agent.post("/v1/chat/completions", chat("m3"))[0] == 200
    assert running(agent) == {"m1", "m3"}
    status, ledger = agent.get("/ledger")
    assert status == 200
    host = next(d for d in ledger["devices"] if d["name"] == "host")
    assert set(host["held"]) == {"m1", "m3"}
    assert sum(host["held"].values()) <= host["limit"]
    assert "evicting model=m2" in agent.log()


def test_busy_models_memory_is_never_taken_the_request_waits(
    start_agent: Any, three_models: Path
) -> None:
    limit = room_for_two(start_agent, three_models)
    agent = memory_agent(start_agent, three_models, limit, env=FAKE_TIMING)
    for model in ("m1", "m2"):
        assert agent.post("/v1/chat/completions", chat(model))[0] == 200
    results: dict[str, Any] = {}

    def send(model: str) -> None:
        results[model] = (agent.post("/v1/chat/completions", chat(model)), time.monotonic())

    busy = [threading.Thread(target=send, args=(m,)) for m in ("m1", "m2")]
    for thread in busy:
        thread.start()
    deadline = time.monotonic() + 10
    while sum(m["corral"]["in_flight"] for m in agent.models().values()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    waiter = threading.Thread(target=send, args=("m3",))
    waiter.start()
    # m3 waits: both holders are busy.
    wait_until(lambda: agent.models()["m3"]["corral"]["queued"] == 1, "m3 queued", timeout=10)
    models = agent.models()
    assert {n for n, m in models.items() if m["status"]["value"] == "loaded"} == {"m1", "m2"}
    for thread in (*busy, waiter):
        thread.join(60)
    assert all(results[m][0][0] == 200 for m in ("m1", "m2", "m3")), results
    # m3 ran only after a busy model had finished its request.
    assert results["m3"][1] > min(results["m1"][1], results["m2"][1])
    assert len(running(agent)) == 2


def test_a_model_larger_than_the_limit_loads_anyway_when_alone(
    start_agent: Any, three_models: Path
) -> None:
    agent = memory_agent(start_agent, three_models, 8)
    status, body = agent.post("/v1/chat/completions", chat("m1"))
    assert status == 200, body
    assert "loading anyway" in agent.log()
    # With m1 running and idle, m2 does not fit: m1 is evicted first, then m2 loads anyway.
    assert agent.post("/v1/chat/completions", chat("m2"))[0] == 200
    assert running(agent) == {"m2"}


def test_flags_turned_off_reach_the_estimate(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    # --no-repack (on the command line) and --no-kv-offload (in a preset) turn off what is on
    # by default; the estimate must see them, not llama-server's defaults.
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copyfile(demo_dir / "demo-medium.gguf", folder / "m.gguf")
    ini = tmp_path / "presets.ini"
    ini.write_text("[m]\nno-kv-offload = true\n")
    common = ("--models-dir", str(folder), "-c", "4096", "--memory-limit", "host=10GiB")
    off = start_agent(*common, "--no-repack", "--models-preset", str(ini))
    entry = off.models()["m"]
    assert "--no-repack" in entry["status"]["args"] and "--no-kv-offload" in entry["status"]["args"]
    from node_agent.memory.estimator import estimate

    expected = estimate(folder / "m.gguf", {"c": "4096", "no-repack": None}, ["host"])
    assert entry["corral"]["memory"]["min"] == {"host": expected.devices["host"].total}


def test_a_limit_on_a_device_this_machine_lacks_is_refused(demo_dir: Path) -> None:
    # It would cap nothing while the user believes the device capped (issue 17, major 11).
    agent = [sys.executable, "-m", "node_agent.cli", "agent", "--port", "0"]
    done = subprocess.run(
        [*agent, "--models-dir", str(demo_dir), "--memory-limit", "CUDA99=20GiB"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--memory-limit names CUDA99, which this machine does not have (devices: host" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
