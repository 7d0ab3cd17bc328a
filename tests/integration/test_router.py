"""The router core with the real agent, real llama-server children and demo models."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, chat, open_stream

TINY, SMALL, MEDIUM = "demo-tiny", "demo-small", "demo-medium"


def loaded(agent: AgentProcess) -> set[str]:
    return {name for name, m in agent.models().items() if m["status"]["value"] == "loaded"}


def complete(agent: AgentProcess, model: str, **extra: Any) -> tuple[int, Any]:
    return agent.post("/v1/chat/completions", chat(model, **extra))


def test_lru_eviction_follows_use(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--models-max", "2", "-c", "1024")
    for model in (TINY, SMALL, MEDIUM):
        status, body = complete(agent, model)
        assert status == 200, body
    assert loaded(agent) == {SMALL, MEDIUM}  # tiny was least recently used
    assert complete(agent, TINY)[0] == 200
    assert loaded(agent) == {TINY, MEDIUM}  # small was used before medium
    assert complete(agent, MEDIUM)[0] == 200  # medium is now younger than tiny
    assert complete(agent, SMALL)[0] == 200
    assert loaded(agent) == {MEDIUM, SMALL}
    assert len(agent.children()) == 2


# A 3,000-token stream took 92 s while other processes kept both cores busy: the waiter
# behind it waits as long as the stream runs (the point is that it completes after it).
@pytest.mark.timeout(400)
def test_streaming_model_is_not_evicted_and_the_waiter_completes_after(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--models-max", "1", "-c", "4096")
    assert complete(agent, MEDIUM)[0] == 200
    conn, stream = open_stream(agent, MEDIUM)

    result: dict[str, Any] = {}

    def other() -> None:
        result["response"] = agent.post("/v1/chat/completions", chat(TINY), timeout=300)
        result["done"] = time.monotonic()

    waiter = threading.Thread(target=other)
    waiter.start()
    # While the stream runs, tiny waits in the queue and medium stays loaded.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and agent.models()[TINY]["corral"]["queued"] == 0:
        time.sleep(0.02)
    models = agent.models()
    assert models[TINY]["corral"]["queued"] == 1
    assert models[MEDIUM]["status"]["value"] == "loaded"
    assert not models[MEDIUM]["corral"]["stopping"]
    chunks = stream.read()
    stream_end = time.monotonic()
    assert chunks.rstrip().endswith(b"data: [DONE]")
    conn.close()
    waiter.join(300)
    status, reply = result["response"]
    assert status == 200, reply
    assert result["done"] > stream_end
    assert loaded(agent) == {TINY}


def test_concurrent_requests_never_exceed_models_max(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--models-max", "2", "-c", "1024")
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(len(agent.children()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    models = [TINY, SMALL, MEDIUM]
    try:
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda i: complete(agent, models[i % 3]), range(32)))
    finally:
        stop.set()
        sampler.join()
    assert [status for status, _ in results] == [200] * 32, results
    assert len(seen) > 0 and max(seen) <= 2, seen


def test_no_autoload_and_per_request_override(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--no-models-autoload")
    status, body = complete(agent, TINY)
    assert (status, body["error"]["message"]) == (400, "model is not loaded")
    status, body = agent.post("/v1/chat/completions?autoload=true", chat(TINY))
    assert status == 200, body
    assert loaded(agent) == {TINY}
    assert complete(agent, TINY)[0] == 200  # loaded now: no autoload needed


def test_load_and_unload_endpoints(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir))
    assert agent.post("/models/load", {"model": TINY}) == (200, {"success": True})
    status, body = agent.post("/models/load", {"model": TINY})
    assert (status, body["error"]["message"]) == (400, "model is already running")
    agent.wait_state(TINY, "loaded")
    assert agent.post("/models/unload", {"model": TINY}) == (200, {"success": True})
    entry = agent.wait_state(TINY, "unloaded")
    assert "failed" not in entry["status"]
    status, body = agent.post("/models/unload", {"model": TINY})
    assert (status, body["error"]["message"]) == (400, "model is not running")
    assert not agent.children()


def test_reload_applies_an_edited_preset(start_agent: Any, demo_dir: Path, tmp_path: Path) -> None:
    ini = tmp_path / "presets.ini"
    ini.write_text(
        f"[chat]\nmodel = {demo_dir / 'demo-tiny.gguf'}\nctx-size = 512\n"
        f"[other]\nmodel = {demo_dir / 'demo-small.gguf'}\n"
    )
    agent = start_agent("--models-preset", str(ini))
    assert complete(agent, "chat")[0] == 200
    assert complete(agent, "other")[0] == 200
    pids = {name: agent.models()[name]["corral"]["pid"] for name in ("chat", "other")}
    ini.write_text(
        f"[chat]\nmodel = {demo_dir / 'demo-tiny.gguf'}\nctx-size = 1024\n"
        f"[other]\nmodel = {demo_dir / 'demo-small.gguf'}\nalias = second\n"
        f"[new]\nmodel = {demo_dir / 'demo-medium.gguf'}\n"
    )
    status, data = agent.get("/models?reload=1")
    assert status == 200
    models = {m["id"]: m for m in data["data"]}
    assert set(models) == {"chat", "other", "new"}
    # chat's arguments changed: it was stopped; other only gained an alias: untouched.
    assert models["chat"]["status"]["value"] == "unloaded"
    assert models["other"]["status"]["value"] == "loaded"
    assert models["other"]["corral"]["pid"] == pids["other"]
    assert models["other"]["aliases"] == ["second"]
    assert "--ctx-size" in models["chat"]["status"]["args"]
    args = models["chat"]["status"]["args"]
    assert args[args.index("--ctx-size") + 1] == "1024"
    assert complete(agent, "second")[0] == 200  # the new alias routes
    assert complete(agent, "chat")[0] == 200


def test_child_killed_from_outside_is_reported_and_reloaded(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent("--models-dir", str(demo_dir))
    assert complete(agent, TINY)[0] == 200
    pid = agent.models()[TINY]["corral"]["pid"]
    os.kill(pid, signal.SIGKILL)
    entry = agent.wait_state(TINY, "unloaded")
    assert entry["status"]["failed"] is True
    assert entry["status"]["exit_code"] == -signal.SIGKILL
    status, body = complete(agent, TINY)
    assert status == 200, body
    assert agent.models()[TINY]["corral"]["pid"] != pid
