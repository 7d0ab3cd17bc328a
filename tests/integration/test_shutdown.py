"""Stops during a stream and the agent's shutdown, with the real agent and real children."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import AgentProcess, alive, chat, http, open_stream, wait_until

MEDIUM, TINY = "demo-medium", "demo-tiny"

pytestmark = pytest.mark.timeout(90)


def watch_exit(pid: int, seen: dict[str, float]) -> threading.Thread:
    """Note (in ``seen["exit"]``) when ``pid`` is gone, polling every 5 ms."""

    def poll() -> None:
        while alive(pid):
            time.sleep(0.005)
        seen["exit"] = time.monotonic()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return thread


def read_stream(stream: Any) -> tuple[list[str], float]:
    """The events of the rest of a stream, and when it ended."""
    rest = stream.read().decode()
    return [line[6:] for line in rest.splitlines() if line.startswith("data: ")], time.monotonic()


def test_unload_during_a_stream_ends_it_with_an_error_event_within_1s_of_the_childs_exit(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    preset = tmp_path / "preset.ini"
    preset.write_text(f"[{MEDIUM}]\nstop-timeout = 1\n")
    agent = start_agent("--models-dir", str(demo_dir), "--models-preset", str(preset), "-c", "4096")
    conn, stream = open_stream(agent, MEDIUM)
    pid = agent.models()[MEDIUM]["corral"]["pid"]
    seen: dict[str, float] = {}
    watcher = watch_exit(pid, seen)
    assert agent.post("/models/unload", {"model": MEDIUM}) == (200, {"success": True})
    events, ended = read_stream(stream)  # the drain (1 s) ends with the child's exit
    conn.close()
    watcher.join(10)
    assert "exit" in seen, "the child never exited"
    print(f"the stream ended {ended - seen['exit']:.3f} s after the child's exit")
    assert ended - seen["exit"] < 1.0, f"the stream ended {ended - seen['exit']:.2f}s after"
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert "stopped mid-response" in error["message"], error
    agent.wait_state(MEDIUM, "unloaded")


def test_sigterm_refuses_late_work_and_exits_within_the_bound(
    start_agent: Any, demo_dir: Path
) -> None:
    """Acceptance 2 of issue 13: SIGTERM with a stream in flight, and a request for another,
    unloaded model 0.3 s later."""
    bound = 6.0
    agent: AgentProcess = start_agent(
        "--models-dir", str(demo_dir), "-c", "4096", "--shutdown-timeout", str(bound)
    )
    conn, stream = open_stream(agent, MEDIUM)
    before = set(agent.children())
    assert len(before) == 1
    spawned_after: set[int] = set()
    stop = threading.Event()

    def census() -> None:  # any llama-server the agent starts from now on
        while not stop.is_set() and agent.proc.poll() is None:
            spawned_after.update(set(agent.children()) - before)
            time.sleep(0.01)

    counter = threading.Thread(target=census, daemon=True)
    counter.start()
    signalled = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # A busy loop may take longer to see the signal: the late request comes once it did.
    wait_until(lambda: "shutting down: refusing" in agent.log(), "the shutdown's start", 10)
    try:
        status, body = http("POST", agent.url + "/v1/chat/completions", chat(TINY), timeout=10)
    except OSError as exc:  # the listener is closed: refused at once
        late: Any = exc
    else:
        late = (status, body)
    events, _ = read_stream(stream)
    conn.close()
    agent.proc.wait(timeout=bound + 10)
    took = time.monotonic() - signalled
    stop.set()
    counter.join(5)
    log = agent.log()

    print(f"late request: {late!r}; exited {took:.2f} s after SIGTERM (bound {bound:g} s)")
    assert isinstance(late, OSError) or late[0] == 503, late
    assert spawned_after == set(), f"spawned after the signal: {spawned_after}\n{log}"
    assert f"model={TINY} pid=" not in log  # never spawned, not even briefly
    assert events, "the stream got nothing"
    last = events[-1]
    assert last == "[DONE]" or "error" in json.loads(last), last
    assert agent.proc.returncode == 0, log
    assert took < bound + 2, f"exited {took:.1f}s after SIGTERM (bound {bound:g}s)\n{log}"


def test_a_second_signal_forces_the_shutdown(start_agent: Any, demo_dir: Path) -> None:
    agent: AgentProcess = start_agent(
        "--models-dir", str(demo_dir), "-c", "4096", "--shutdown-timeout", "50"
    )
    conn, _ = open_stream(agent, MEDIUM)
    pid = agent.models()[MEDIUM]["corral"]["pid"]
    agent.proc.send_signal(signal.SIGTERM)
    # The second once the agent took the first: two SIGTERMs that reach it before it runs are
    # one (the kernel keeps one pending signal of a kind), and it would drain for 50 s.
    wait_until(lambda: "shutting down: refusing" in agent.log(), "the shutdown's start", 10)
    signalled = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    agent.proc.wait(timeout=20)
    took = time.monotonic() - signalled
    conn.close()
    print(f"exited {took:.2f} s after the second signal")
    assert took < 10, took
    assert not alive(pid)
    assert "forcing the shutdown (a second signal)" in agent.log()


def test_sigterm_ends_the_event_and_log_streams_at_once(start_agent: Any, demo_dir: Path) -> None:
    """An open ``/models/sse`` (or ``/models/logs?follow=1``) never holds the shutdown: both
    streams end cleanly (their last chunk sent) and the agent exits long before its bound."""
    bound = 20.0
    agent: AgentProcess = start_agent(
        "--models-dir", str(demo_dir), "--shutdown-timeout", str(bound)
    )
    streams = []
    for path in ("/models/sse", f"/models/logs?model={TINY}&follow=1"):
        conn = HTTPConnection("127.0.0.1", agent.port, timeout=bound + 10)
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200, path
        streams.append((path, conn, response))
    assert agent.post("/models/load", {"model": TINY}) == (200, {"success": True})
    agent.wait_state(TINY, "loaded")
    signalled = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    ended = {}
    for path, conn, response in streams:
        # A stream cut without its last chunk raises IncompleteRead here.
        text = response.read().decode()
        ended[path] = time.monotonic() - signalled
        conn.close()
        assert text, f"{path} sent nothing"
    agent.proc.wait(timeout=bound + 10)
    took = time.monotonic() - signalled
    log = agent.log()
    print(f"streams ended after {ended} s; exited {took:.2f} s after SIGTERM (bound {bound:g} s)")
    assert agent.proc.returncode == 0, log
    assert "forcing the shutdown" not in log, log
    # Nothing is left to drain but the idle child (stopped in well under a second): half the
    # bound leaves room for a loaded machine.
    assert took < bound / 2, f"exited {took:.1f}s after SIGTERM (bound {bound:g}s)\n{log}"
