"""Controls beyond llama.cpp's router: TTL, pin, priority, bounded queues (real children)."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.harness import AgentProcess, chat, wait_until

TINY, SMALL, MEDIUM = "demo-tiny", "demo-small", "demo-medium"
FAKE_TIMING = {"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}  # every proxied request holds 2 s


def presets(tmp_path: Path, demo_dir: Path, **extra: dict[str, str]) -> str:
    """An INI with the three demo models, plus per-model extra keys."""
    lines = []
    for name in (TINY, SMALL, MEDIUM):
        lines.append(f"[{name}]\nmodel = {demo_dir / (name + '.gguf')}\nctx-size = 1024")
        for key, value in extra.get(name.replace("-", "_"), {}).items():
            lines.append(f"{key} = {value}")
    path = tmp_path / "presets.ini"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def complete(agent: AgentProcess, model: str, **extra: Any) -> tuple[int, Any]:
    return agent.post("/v1/chat/completions", chat(model, **extra))


def loaded(agent: AgentProcess) -> set[str]:
    return {name for name, m in agent.models().items() if m["status"]["value"] == "loaded"}


def in_background(
    agent: AgentProcess, model: str, **extra: Any
) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        result["response"] = complete(agent, model, **extra)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def answer(agent: AgentProcess, model: str) -> tuple[int, Any, Any]:
    """A chat request's status, headers and JSON body."""
    request = urllib.request.Request(
        agent.url + "/v1/chat/completions",
        data=json.dumps(chat(model)).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.loads(err.read())


def test_ttl_unloads_an_idle_model_but_never_one_in_flight(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir, demo_tiny={"ttl": "1"})
    agent = start_agent("--models-preset", ini, env=FAKE_TIMING)
    started = time.monotonic()
    assert complete(agent, TINY)[0] == 200  # 2 s load + 2 s in flight: longer than the ttl
    assert time.monotonic() - started >= 3.5
    finished = time.monotonic()
    assert TINY in loaded(agent)  # it was never unloaded while its request ran
    agent.wait_state(TINY, "unloaded", timeout=10)
    assert time.monotonic() - finished >= 0.9  # counted from the end of the request


def test_models_ttl_default_and_preset_override(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir, demo_small={"ttl": "0"})  # 0 in a preset: never
    agent = start_agent("--models-preset", ini, "--models-ttl", "1")
    assert complete(agent, TINY)[0] == 200
    assert complete(agent, SMALL)[0] == 200
    agent.wait_state(TINY, "unloaded", timeout=10)
    time.sleep(0.5)
    assert loaded(agent) == {SMALL}


def test_pinned_model_is_never_a_victim(start_agent: Any, demo_dir: Path, tmp_path: Path) -> None:
    ini = presets(tmp_path, demo_dir, demo_tiny={"pin": "true", "load-on-startup": "true"})
    agent = start_agent("--models-preset", ini, "--models-max", "2")
    agent.wait_state(TINY, "loaded")  # load-on-startup + pin: always resident
    assert complete(agent, SMALL)[0] == 200
    assert complete(agent, MEDIUM)[0] == 200  # tiny is least recently used, but pinned
    assert loaded(agent) == {TINY, MEDIUM}
    assert complete(agent, SMALL)[0] == 200
    assert loaded(agent) == {TINY, SMALL}


def test_priority_orders_victims_before_recency(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir, demo_tiny={"priority": "10"})
    agent = start_agent("--models-preset", ini, "--models-max", "2")
    assert complete(agent, TINY)[0] == 200
    assert complete(agent, SMALL)[0] == 200
    assert complete(agent, MEDIUM)[0] == 200  # tiny is older but more important: small goes
    assert loaded(agent) == {TINY, MEDIUM}


def test_queue_timeout_answers_503_with_retry_after(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir)
    agent = start_agent(
        "--models-preset", ini, "--models-max", "1", "--queue-timeout", "1", env=FAKE_TIMING
    )
    # tiny loads (2 s: longer than the queue timeout, which bounds the wait for a turn, not a
    # load under way) then holds its model (2 s) while small waits for the only slot.
    busy, result = in_background(agent, TINY)
    wait_until(lambda: agent.models()[TINY]["status"]["value"] == "loaded", f"{TINY} loaded")
    started = time.monotonic()
    status, headers, body = answer(agent, SMALL)
    waited = time.monotonic() - started
    assert status == 503, body
    assert headers["Retry-After"] == "1"
    assert "queue timeout" in body["error"]["message"]
    assert 0.9 <= waited < 3
    busy.join(30)
    assert result["response"][0] == 200


def test_max_queue_refuses_extra_waiters_at_once(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir)
    agent = start_agent("--models-preset", ini, "--models-max", "1", "--max-queue", "1")
    # A long stream keeps tiny busy; one request for small may wait, a second may not.
    busy, busy_result = in_background(agent, TINY, max_tokens=3000, ignore_eos=True)
    wait_until(lambda: agent.models()[TINY]["corral"]["in_flight"] == 1, f"{TINY} in flight")
    waiter, waiter_result = in_background(agent, SMALL)
    wait_until(lambda: agent.models()[SMALL]["corral"]["queued"] == 1, f"{SMALL} queued")
    status, headers, body = answer(agent, SMALL)
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert "--max-queue 1" in body["error"]["message"]
    busy.join(60)
    waiter.join(60)
    assert busy_result["response"][0] == 200
    assert waiter_result["response"][0] == 200


def test_keep_alive_zero_unloads_when_idle_and_minus_one_keeps_forever(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir)
    agent = start_agent("--models-preset", ini, "--models-ttl", "1")
    assert complete(agent, TINY, keep_alive=0)[0] == 200
    agent.wait_state(TINY, "unloaded", timeout=5)
    assert complete(agent, SMALL, keep_alive=-1)[0] == 200  # outlives --models-ttl 1
    assert complete(agent, MEDIUM, keep_alive="1s")[0] == 200
    agent.wait_state(MEDIUM, "unloaded", timeout=10)
    assert agent.models()[SMALL]["status"]["value"] == "loaded"
    status, body = complete(agent, TINY, keep_alive="soon")
    assert status == 400
    assert "keep_alive 'soon' is not a duration" in body["error"]["message"]


def test_model_logs_endpoint_and_request_log_lines(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    ini = presets(tmp_path, demo_dir)
    agent = start_agent("--models-preset", ini)
    assert complete(agent, TINY, ignore_eos=True)[0] == 200  # exactly 4 tokens, logged below
    status, text = agent.get(f"/models/logs?model={TINY}")
    assert status == 200
    assert "llama" in text and "model" in text  # the child's own stderr lines
    # A trickle of the child's lines is read at most every 0.25 s: more than 3 come.
    wait_until(
        lambda: "model loaded" in agent.get(f"/models/logs?model={TINY}")[1],
        "the child's 'model loaded' line",
        timeout=10,
    )
    status, text = agent.get(f"/models/logs?model={TINY}&lines=3")
    assert status == 200 and len(text.strip().splitlines()) == 3
    status, body = agent.get("/models/logs?model=nope")
    assert (status, body["error"]["message"]) == (400, "model 'nope' not found")
    # follow=1 streams: the backlog first, then new lines as the child writes them.
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    conn.request("GET", f"/models/logs?model={SMALL}&follow=1&lines=0")
    stream = conn.getresponse()
    assert stream.status == 200
    assert complete(agent, SMALL)[0] == 200  # loads small: its stderr flows to the follower
    assert stream.readline().strip()
    conn.close()
    line = next(x for x in agent.log().splitlines() if "corral.requests" in x and TINY in x)
    assert "POST /v1/chat/completions" in line and "status=200" in line
    assert "prompt_tokens=" in line and "generated_tokens=4" in line


def test_max_body_size_refuses_bigger_bodies_with_413(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    agent = start_agent("--models-preset", presets(tmp_path, demo_dir), "--max-body-size", "1KiB")
    status, body = complete(agent, TINY, padding="x" * 2048)
    assert status == 413
    assert "request body too large" in body["error"]["message"]
    assert complete(agent, TINY)[0] == 200  # a body under the limit is served
