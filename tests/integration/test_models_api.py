"""``POST /models`` / ``DELETE /models`` through the real agent, from a local Hugging Face hub
(``hf_server``) serving generated GGUFs: the events, the listing, the files in the cache (the
layout llama.cpp writes), a refused overlapping download, a resumed partial one, a cancelled
one, a request that waits for a download and is then served by a real child."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.sources.hf_cache import hub_dir, scan_hf_cache
from tests.integration.harness import (
    AgentProcess,
    chat,
    free_port,
    http,
    stop_process,
    wait_healthy,
    wait_until,
)
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.model_events import EventLog

REPO = "corral-test/tiny"
MODEL = f"{REPO}:Q8_0"


@pytest.fixture
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add(
        REPO,
        {
            "tiny-Q8_0.gguf": (demo_dir / "demo-tiny.gguf").read_bytes(),
            "tiny-F16.gguf": (demo_dir / "demo-small.gguf").read_bytes(),
            "README.md": b"a test repository\n",
        },
    )
    yield server
    server.close()


@pytest.fixture
def agent_env(tmp_path: Path, hub: HubServer) -> dict[str, str]:
    return {
        "HF_HOME": str(tmp_path / "hf"),
        "MODEL_ENDPOINT": hub.url + "/",
        "LLAMA_CACHE": "",
        "XDG_STATE_HOME": str(tmp_path / "state"),  # one agent's, and its restart's
    }


Start = Callable[..., AgentProcess]


@pytest.fixture
def agent(start_agent: Start, agent_env: dict[str, str]) -> AgentProcess:
    return start_agent("--models-max", "1", "-c", "512", env=agent_env)


def repo_dir(env: dict[str, str]) -> Path:
    return Path(env["HF_HOME"], "hub", "models--corral-test--tiny")


def listed(agent: AgentProcess) -> dict[str, dict[str, Any]]:
    return agent.models()


@pytest.fixture
def sse(start_agent: Start) -> Iterator[Callable[[int], EventLog]]:
    # After start_agent: the streams close before the agents stop.

    logs: list[EventLog] = []

    def open_log(port: int) -> EventLog:
        logs.append(EventLog(port))
        return logs[-1]

    yield open_log
    for log in logs:
        log.close()


Sse = Callable[[int], EventLog]


def test_download_events_listing_and_cache_layout(
    sse: Sse, agent: AgentProcess, hub: HubServer, agent_env: dict[str, str], demo_dir: Path
) -> None:
    events = sse(agent.port)
    hub.hold(300_000)  # the download stays on its way until released
    assert agent.post("/models", {"model": MODEL}) == (200, {"success": True})

    events.wait(lambda: "download_progress" in events.names(MODEL), "progress")
    during = listed(agent)[MODEL]
    assert during["status"]["value"] == "downloading"
    assert during["source"] == "cache" and during["can_remove"] is True
    assert agent.post("/models", {"model": MODEL}) == (
        400,
        {
            "error": {
                "code": 400,
                "message": f"model '{MODEL}' already exists",
                "type": "invalid_request_error",
            }
        },
    )
    hub.release()
    events.wait(lambda: "models_reload" in [e["event"] for e in events.events], "the reload")

    assert events.names(MODEL) == ["model_status", "download_progress", "download_finished"]
    first = events.of(MODEL)[0]
    assert first["data"] == {"status": "downloading"}
    progress = [e["data"]["progress"] for e in events.of(MODEL) if "progress" in e.get("data", {})]
    (url,) = progress[-1]
    size = (demo_dir / "demo-tiny.gguf").stat().st_size
    assert url.endswith(f"/{REPO}/resolve/{hub.commit(REPO)}/tiny-Q8_0.gguf")
    assert progress[-1][url] == {"done": size, "total": size}
    after = listed(agent)[MODEL]
    assert after["status"]["value"] == "unloaded"
    assert after["source"] == "cache" and after["can_remove"] is True

    # llama.cpp's layout: refs/main, a blob named by its SHA-256, a relative snapshot link.
    folder = repo_dir(agent_env)
    commit = hub.commit(REPO)
    assert (folder / "refs" / "main").read_text() == commit
    sha = hashlib.sha256((demo_dir / "demo-tiny.gguf").read_bytes()).hexdigest()
    link = folder / "snapshots" / commit / "tiny-Q8_0.gguf"
    assert os.readlink(link) == f"../../blobs/{sha}"
    assert (folder / "blobs" / sha).stat().st_size == size
    assert [s.name for s in scan_hf_cache(hub_dir(agent_env))] == [MODEL]  # Corral's own scan

    # Served by a real child from the cache.
    status, body = agent.post("/v1/chat/completions", chat(MODEL), timeout=120)
    assert status == 200, body


def test_a_download_sharing_files_with_one_on_its_way_is_refused(
    agent: AgentProcess, hub: HubServer
) -> None:
    hub.hold(100_000)
    assert agent.post("/models", {"model": MODEL})[0] == 200
    # Another name for the same file (the tag matches case-insensitively).
    status, body = agent.post("/models", {"model": f"{REPO}:q8_0"})
    assert status == 400
    assert body["error"]["message"] == (
        f"model '{REPO}:q8_0' shares files with '{MODEL}', which is downloading; "
        "try again once it is done"
    )
    # A different file of the same repository is not in the way.
    assert agent.post("/models", {"model": f"{REPO}:F16"})[0] == 200
    hub.release()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "shutdown"])
def test_a_partial_download_resumes_after_a_restart(
    how: signal.Signals,
    start_agent: Start,
    hub: HubServer,
    agent_env: dict[str, str],
    demo_dir: Path,
) -> None:
    first = start_agent(env=agent_env)
    hub.hold(400_000)
    assert first.post("/models", {"model": MODEL})[0] == 200
    blobs = repo_dir(agent_env) / "blobs"
    partial: list[Path] = []
    wait_until(
        lambda: (
            bool(partial := list(blobs.glob("*.downloadInProgress")))
            and partial[0].stat().st_size >= 400_000
        ),
        "the partial file",
    )
    first.proc.send_signal(how)  # a crash (no chance to clean up), or a shutdown
    first.proc.wait(60)
    hub.release()
    (partial,) = blobs.glob("*.downloadInProgress")

    # The restarted agent resumes it by itself (issue 29, item 9: it used to forget it).
    second = start_agent(env=agent_env)
    wait_until(lambda: listed(second).get(MODEL, {}).get("status", {}).get("value") == "unloaded",
               "the resumed download's model")  # fmt: skip
    assert "resuming its download (unfinished at the last stop)" in second.log()

    resumed = hub.resolves()[-1]
    assert resumed.range == "bytes=400000-"
    blob = blobs / partial.name.removesuffix(".downloadInProgress")
    assert blob.read_bytes() == (demo_dir / "demo-tiny.gguf").read_bytes()
    assert not list(blobs.glob("*.downloadInProgress"))


def test_unload_cancels_a_download_and_delete_removes_a_model(
    sse: Sse, agent: AgentProcess, hub: HubServer, agent_env: dict[str, str]
) -> None:
    events = sse(agent.port)
    hub.hold(100_000)
    assert agent.post("/models", {"model": MODEL})[0] == 200
    events.wait_event(MODEL, "download_progress")
    assert agent.post("/models/unload", {"model": MODEL}) == (200, {"success": True})
    events.wait_event(MODEL, "download_failed")
    assert MODEL not in listed(agent)
    assert not list((repo_dir(agent_env) / "blobs").glob("*"))  # the partial file is gone
    hub.release()

    assert agent.post("/models", {"model": MODEL})[0] == 200
    events.wait_event(MODEL, "download_finished")
    events.wait(lambda: MODEL in listed(agent), "the cache model")
    assert http("DELETE", f"{agent.url}/models?model={MODEL}") == (200, {"success": True})
    events.wait_event(MODEL, "model_remove")
    assert MODEL not in listed(agent)
    assert not list((repo_dir(agent_env) / "blobs").glob("*"))
    assert scan_hf_cache(hub_dir(agent_env)) == []


def test_a_request_for_a_downloading_model_waits_for_it(
    agent: AgentProcess, hub: HubServer
) -> None:
    hub.hold(100_000)
    assert agent.post("/models", {"model": MODEL})[0] == 200
    answer: list[tuple[int, Any]] = []
    waiter = threading.Thread(
        target=lambda: answer.append(agent.post("/v1/chat/completions", chat(MODEL), timeout=120))
    )
    waiter.start()
    waiter.join(1.0)
    assert not answer  # still waiting: llama.cpp would have answered 400 "not running"
    hub.release()
    waiter.join(120)
    assert answer and answer[0][0] == 200, answer


def test_the_hf_token_goes_to_the_hub(
    start_agent: Start, hub: HubServer, agent_env: dict[str, str]
) -> None:
    token = "hf_" + "a1" * 18
    hub.token = token
    agent = start_agent(env={**agent_env, "HF_TOKEN": token})
    assert agent.post("/models", {"model": MODEL})[0] == 200
    wait_until(lambda: MODEL in listed(agent) and agent.state(MODEL) == "unloaded", "the model")
    assert {r.authorization for r in hub.requests} == {f"Bearer {token}"}

    other = start_agent(env={**agent_env, "HF_TOKEN": ""})  # no token: the hub says 401
    status, body = other.post("/models", {"model": f"{REPO}:F16"})
    assert status == 400
    assert "needs a valid token (--hf-token or HF_TOKEN)" in body["error"]["message"]


def test_a_preset_download_holds_no_slot_and_no_memory(
    sse: Sse, start_agent: Start, hub: HubServer, tmp_path: Path, demo_dir: Path
) -> None:
    """``--models-max 1``: a loaded model stays loaded while another one's file downloads
    (llama.cpp counts a downloading child against the limit); the ledger holds nothing for
    the download; the model loads once its file is in."""
    data = (demo_dir / "demo-tiny.gguf").read_bytes()
    ini = tmp_path / "presets.ini"
    ini.write_text(
        f"[local]\nmodel = {demo_dir / 'demo-tiny.gguf'}\n\n"
        f"[remote]\nmodel-url = {hub.url}/{REPO}/resolve/main/tiny-Q8_0.gguf\n"
        f"model-sha256 = {hashlib.sha256(data).hexdigest()}\n"
    )
    agent = start_agent(
        "--models-preset",
        str(ini),
        "--models-max",
        "1",
        "--memory-limit",
        "host=4GiB",
        "-c",
        "512",
        env={"LLAMA_CACHE": str(tmp_path / "cache")},
    )
    events = sse(agent.port)
    assert agent.post("/v1/chat/completions", chat("local"))[0] == 200
    hub.hold(300_000)
    answers: list[tuple[int, Any]] = []
    waiter = threading.Thread(
        target=lambda: answers.append(agent.post("/v1/chat/completions", chat("remote")))
    )
    waiter.start()
    events.wait_event("remote", "download_progress")

    assert agent.state("remote") == "downloading"
    assert agent.state("local") == "loaded"  # not evicted for a download
    _, ledger = agent.get("/ledger")
    held = {m for device in ledger["devices"] for m in device.get("held", {})}
    assert held == {"local"}

    hub.release()
    waiter.join(120)
    assert answers and answers[0][0] == 200, answers
    assert agent.state("remote") == "loaded" and agent.state("local") == "unloaded"
    assert events.names("remote")[:3] == ["model_status", "download_progress", "download_finished"]


def test_shards_and_the_projector_come_along(
    sse: Sse, agent: AgentProcess, hub: HubServer, agent_env: dict[str, str]
) -> None:
    files = {
        "big/m-BIG-00001-of-00002.gguf": b"first shard",
        "big/m-BIG-00002-of-00002.gguf": b"second shard",
        "mmproj-m-F16.gguf": b"projector",
        "other-Q8_0.gguf": b"not this one",
    }
    hub.add("corral-test/sharded", files)
    events = sse(agent.port)
    assert agent.post("/models", {"model": "corral-test/sharded:BIG"})[0] == 200
    events.wait_event("corral-test/sharded:BIG", "download_finished")

    snapshot = Path(
        agent_env["HF_HOME"], "hub", "models--corral-test--sharded", "snapshots"
    ) / hub.commit("corral-test/sharded")
    got = {str(p.relative_to(snapshot)): p.read_bytes() for p in snapshot.rglob("*.gguf")}
    assert got == {k: v for k, v in files.items() if not k.startswith("other")}
    found = {s.name: s for s in scan_hf_cache(hub_dir(agent_env))}
    assert found["corral-test/sharded:BIG"].cache_mmproj == str(snapshot / "mmproj-m-F16.gguf")
    progress = [
        e for e in events.of("corral-test/sharded:BIG") if e["event"] == "download_progress"
    ]
    assert len(progress[-1]["data"]["progress"]) == 3  # one entry per file, as llama.cpp sends


def test_waiting_for_a_download_is_bounded_by_the_queue_limits(
    start_agent: Start, hub: HubServer, agent_env: dict[str, str]
) -> None:
    agent = start_agent("--queue-timeout", "1", "--max-queue", "1", env=agent_env)
    hub.hold(100_000)
    assert agent.post("/models", {"model": MODEL})[0] == 200
    answers: list[tuple[int, Any]] = []
    first = threading.Thread(
        target=lambda: answers.append(agent.post("/v1/chat/completions", chat(MODEL)))
    )
    first.start()
    wait_until(lambda: bool(answers) or _waiting(agent), "the first waiter")
    status, body = agent.post("/v1/chat/completions", chat(MODEL))  # a second: over --max-queue
    assert status == 503
    assert body["error"]["message"].startswith(f"too many requests are waiting for model '{MODEL}'")
    first.join(30)
    assert answers[0][0] == 503
    assert answers[0][1]["error"]["message"] == (
        f"model '{MODEL}' did not become available within the queue timeout (1 s): "
        "its download is still running; try again later"
    )
    hub.release()


def _waiting(agent: AgentProcess) -> bool:
    return "waits for its download" in agent.log()


def test_llama_server_finds_the_download_offline(
    sse: Sse, agent: AgentProcess, hub: HubServer, agent_env: dict[str, str], b11434: Path
) -> None:
    """The cache Corral wrote is the one llama.cpp reads: ``llama-server -hf … --offline``
    (b11434, no endpoint reachable) loads the model from it."""
    events = sse(agent.port)
    assert agent.post("/models", {"model": MODEL})[0] == 200
    events.wait_event(MODEL, "download_finished")
    port = free_port()
    env = {**os.environ, "HF_HOME": agent_env["HF_HOME"], "MODEL_ENDPOINT": "http://127.0.0.1:9/"}
    env.pop("LLAMA_CACHE", None)
    log = agent_env["HF_HOME"] + "/llama-offline.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(b11434), "-hf", MODEL, "--offline", "--port", str(port), "-c", "512"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(proc, port, lambda: Path(log).read_text(errors="replace"), "llama-server -hf")
        status, _ = http("GET", f"http://127.0.0.1:{port}/health")
        assert status == 200
    finally:
        stop_process(proc)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        # Options the restricted preset policy refuses: its reason, word for word.
        ({"mcp-servers-json": '{"mcpServers": {}}'}, "is not on the list of options"),
        ({"--chat-template-file": "/proc/self/environ"}, "is not on the list of options"),
        ({"hf-token": "hf_x"}, "is not on the list of options"),
        # Anything else would be dropped without a word: refused, saying where options go.
        ({"ctx-size": 4096}, "options come from the node's presets"),
        ({"args": ["--rpc", "10.0.0.1:50052"]}, "options come from the node's presets"),
    ],
)
def test_post_models_carries_no_options(
    agent: AgentProcess, hub: HubServer, extra: dict[str, Any], says: str
) -> None:
    """A model added over HTTP carries only its name (``hf-repo``), as llama.cpp's router reads
    only ``model`` there: a request that asks for more is refused, nothing is downloaded."""
    status, body = agent.post("/models", {"model": MODEL, **extra})
    assert status == 400, body
    message = body["error"]["message"]
    key = next(iter(extra))
    assert "POST /models" in message and repr(key) in message and says in message, message
    assert MODEL not in listed(agent)
    assert hub.resolves() == []


def _preset_ini(tmp_path: Path, hub: HubServer, sha256: str) -> Path:
    ini = tmp_path / "presets.ini"
    ini.write_text(
        f"[remote]\nmodel-url = {hub.url}/{REPO}/resolve/main/tiny-Q8_0.gguf\n"
        f"model-sha256 = {sha256}\n"
    )
    return ini


def test_a_load_outlasts_the_queue_limits_while_its_file_downloads(
    sse: Sse, start_agent: Start, hub: HubServer, tmp_path: Path, demo_dir: Path
) -> None:
    """``POST /models/load`` answered success: the load goes on however long the download takes
    (``--queue-timeout`` bounds requests that wait, not a load already promised)."""
    data = (demo_dir / "demo-tiny.gguf").read_bytes()
    ini = _preset_ini(tmp_path, hub, hashlib.sha256(data).hexdigest())
    agent = start_agent(
        "--models-preset",
        str(ini),
        "--queue-timeout",
        "1",
        "--max-queue",
        "1",
        "-c",
        "512",
        env={"LLAMA_CACHE": str(tmp_path / "cache")},
    )
    events = sse(agent.port)
    hub.hold(100_000)
    assert agent.post("/models/load", {"model": "remote"}) == (200, {"success": True})
    events.wait_event("remote", "download_progress")
    threading.Event().wait(2.5)  # past --queue-timeout: the load still waits
    assert agent.state("remote") == "downloading"
    hub.release()
    wait_until(lambda: agent.state("remote") == "loaded", "the load after the download")


def test_a_failed_download_of_a_loading_preset_shows_as_failed(
    sse: Sse, start_agent: Start, hub: HubServer, tmp_path: Path
) -> None:
    ini = _preset_ini(tmp_path, hub, "0" * 64)  # the file never matches
    agent = start_agent(
        "--models-preset", str(ini), "-c", "512", env={"LLAMA_CACHE": str(tmp_path / "cache")}
    )
    events = sse(agent.port)
    assert agent.post("/models/load", {"model": "remote"}) == (200, {"success": True})
    events.wait_event("remote", "download_failed")
    wait_until(lambda: not _downloading(agent), "the download's end")
    entry = listed(agent)["remote"]
    assert entry["status"]["value"] == "unloaded"
    assert entry["status"].get("failed") is True, entry
    assert "sha256" in (entry["corral"]["error"] or ""), entry


def _downloading(agent: AgentProcess) -> bool:
    return agent.state("remote") == "downloading"
