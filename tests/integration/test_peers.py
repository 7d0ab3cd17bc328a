"""Peers (``--peer``), with real agents on loopback: a request goes, in one hop, to the agent
where its model is loaded; a forwarded request is never forwarded again; a peer that dies
mid-stream is an error event to the client, quickly, never a hang."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.integration.harness import AgentProcess, alive, chat, free_port

pytestmark = pytest.mark.timeout(120)

KEY = "cluster-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TINY, SMALL = "demo-tiny", "demo-small"


@pytest.fixture
def pair(demo_dir: Path) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    """Agents A and B, ``--models-max 1`` each, each the other's ``--peer``."""
    ports = free_port(), free_port()
    common = ["--models-dir", str(demo_dir), "--models-max", "1", "--api-key", KEY]
    agents = [
        AgentProcess(
            [*common, "--peer", f"http://127.0.0.1:{other}", "--log-level", "debug"], port=mine
        )
        for mine, other in (ports, ports[::-1])
    ]
    yield agents[0], agents[1]
    for agent in agents:
        agent.stop()


def post(agent: AgentProcess, body: Any, query: str = "", **headers: str) -> tuple[int, Any]:
    return agent.post(f"/v1/chat/completions{query}", body, headers={**AUTH, **headers})


def states(agent: AgentProcess) -> dict[str, str]:
    status, data = agent.get("/models", headers=AUTH)
    assert status == 200, data
    return {m["id"]: m["status"]["value"] for m in data["data"]}


def in_flight(agent: AgentProcess, model: str) -> int:
    status, data = agent.get("/models", headers=AUTH)
    assert status == 200, data
    return next(int(m["corral"]["in_flight"]) for m in data["data"] if m["id"] == model)


def loads(agent: AgentProcess) -> float:
    """Loads of any model that ended ready, from the agent's own metrics."""
    status, text = agent.get("/metrics", headers=AUTH)
    assert status == 200, text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("corral_model_loads_total{") and 'result="loaded"' in line
    )


def served_by_peer(a: AgentProcess, model: str, timeout: float = 30) -> dict[str, Any]:
    """Ask A for ``model`` without letting A load it (``?autoload=false``) until A's peer view
    has caught up and forwards it: A never loads it, whatever the timing."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = post(a, chat(model), "?autoload=false")
        if status == 200:
            assert isinstance(body, dict)
            return body
        assert time.monotonic() < deadline, f"A never forwarded {model}: {status} {body}"
        time.sleep(0.2)


def load(agent: AgentProcess, model: str) -> None:
    status, body = agent.post("/models/load", {"model": model}, headers=AUTH)
    assert status == 200, body
    deadline = time.monotonic() + 30
    while states(agent)[model] != "loaded":
        assert time.monotonic() < deadline, f"{model} never loaded: {states(agent)}"
        time.sleep(0.05)


def test_a_request_for_a_model_loaded_on_the_peer_is_served_there(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    load(b, TINY)
    answer = served_by_peer(a, TINY)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    # With autoload on too: still B, and A has loaded nothing.
    status, body = post(a, chat(TINY))
    assert status == 200, body
    assert states(a)[TINY] == "unloaded"
    assert (loads(a), loads(b)) == (0, 1)
    assert a.children() == []
    assert f"model={TINY} goes to {b.url}: " in a.log()


def test_a_model_not_loaded_anywhere_fills_a_free_peer_before_evicting_here(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    load(a, TINY)
    served_by_peer(a, TINY)  # A's own model: here; and the poll has seen B by now
    deadline = time.monotonic() + 30
    while f"peer {b.url} answers" not in a.log():
        assert time.monotonic() < deadline, a.log()
        time.sleep(0.1)
    status, body = post(a, chat(SMALL))  # A is full; B has a free slot
    assert status == 200, body
    assert (states(a)[TINY], states(a)[SMALL]) == ("loaded", "unloaded")
    assert states(b)[SMALL] == "loaded"


def test_a_model_that_fits_a_peers_free_memory_and_not_here_goes_there(
    demo_dir: Path,
) -> None:
    """Both have free slots; SMALL's min (~20 MB) is over A's host limit, TINY's (~9 MB) is
    not: A serves TINY itself and sends SMALL to B, whose ledger has the room (GET /ledger)."""
    ports = free_port(), free_port()
    common = ["--models-dir", str(demo_dir), "--api-key", KEY, "--log-level", "debug"]
    limits = ("host=16MiB", "host=8GiB")
    agents = [
        AgentProcess(
            [*common, "--memory-limit", limit, "--peer", f"http://127.0.0.1:{other}"], port=mine
        )
        for mine, other, limit in ((*ports, limits[0]), (*ports[::-1], limits[1]))
    ]
    a, b = agents
    try:
        deadline = time.monotonic() + 30
        while f"peer {b.url} answers" not in a.log():
            assert time.monotonic() < deadline, a.log()
            time.sleep(0.1)
        for model in (SMALL, TINY):
            status, body = post(a, chat(model))
            assert status == 200, body
        assert (states(a)[SMALL], states(a)[TINY]) == ("unloaded", "loaded")
        assert (states(b)[SMALL], states(b)[TINY]) == ("loaded", "unloaded")
        assert f"model={SMALL} goes to {b.url}: fits on" in a.log()
    finally:
        for agent in agents:
            agent.stop()


def test_a_forwarded_request_is_served_where_it_arrives(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    load(a, TINY)
    served_by_peer(b, TINY)  # B forwards TINY to A now
    # The same request marked as forwarded: B serves it itself (loads it), no second hop.
    status, body = post(b, chat(TINY), **{"X-Corral-Forwarded": "test"})
    assert status == 200, body
    assert states(b)[TINY] == "loaded"
    assert loads(a) == 1 and loads(b) == 1


def long_stream_through(
    a: AgentProcess, b: AgentProcess, **headers: str
) -> tuple[HTTPConnection, HTTPResponse]:
    """A long stream for TINY, loaded on B, sent to A: tokens already flowing from B."""
    load(b, TINY)
    served_by_peer(a, TINY)
    conn = HTTPConnection("127.0.0.1", a.port, timeout=60)
    body = chat(TINY, max_tokens=3000, stream=True, ignore_eos=True)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {**AUTH, "Content-Type": "application/json", **headers},
    )
    stream = conn.getresponse()
    assert stream.status == 200
    assert stream.readline().startswith(b"data: ")  # tokens flow from B through A
    return conn, stream


def test_a_peer_that_dies_mid_stream_ends_the_stream_with_an_error(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    conn, stream = long_stream_through(a, b, **{"X-Conversation-Id": "c-1"})
    children = b.children()
    os.kill(b.proc.pid, signal.SIGKILL)  # B and (PR_SET_PDEATHSIG) its child
    started = time.monotonic()
    rest = stream.read()  # ends: never a hang (the socket's 60 s timeout would fail it)
    took = time.monotonic() - started
    conn.close()
    events = [json.loads(line[6:]) for line in rest.splitlines() if line.startswith(b"data: {")]
    assert "stopped mid-response" in events[-1]["error"]["message"], events[-1]
    assert took < 15, took
    b.proc.wait()
    for pid in children:
        deadline = time.monotonic() + 10
        while alive(pid):
            assert time.monotonic() < deadline, f"B's child {pid} outlived it"
            time.sleep(0.05)


def test_a_peer_that_dies_mid_answer_is_a_502_and_is_left_out(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    load(b, TINY)
    served_by_peer(a, TINY)
    answers: list[tuple[int, Any, float]] = []

    def ask() -> None:  # a long answer in one piece, forwarded by A to B
        started = time.monotonic()
        status, body = post(a, chat(TINY, max_tokens=3000, ignore_eos=True))
        answers.append((status, body, time.monotonic() - started))

    asker = threading.Thread(target=ask)
    asker.start()
    deadline = time.monotonic() + 30
    while in_flight(b, TINY) == 0:
        assert time.monotonic() < deadline, "the forwarded request never reached B"
        time.sleep(0.02)
    os.kill(b.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    asker.join(timeout=30)
    assert not asker.is_alive(), "the client still waits for a dead peer"
    status, body, _ = answers[0]
    assert status == 502, body
    assert "the model's server" in body["error"]["message"], body
    assert time.monotonic() - killed < 15
    assert f"peer {b.url} failed a forwarded request" in a.log()
    # The next request is not sent to the dead peer: A loads the model itself.
    status, body = post(a, chat(TINY))
    assert status == 200, body
    assert states(a)[TINY] == "loaded"
    b.proc.wait()


def test_a_client_that_goes_away_mid_stream_ends_the_peers_work(
    pair: tuple[AgentProcess, AgentProcess],
) -> None:
    a, b = pair
    conn, _ = long_stream_through(a, b)
    assert in_flight(b, TINY) == 1  # B serves it
    conn.close()  # the client hangs up; A's handler is cancelled and closes its hop to B
    # The whole answer takes ~14 s here (measured): B stopping within 5 s is the hang-up.
    deadline = time.monotonic() + 5
    while in_flight(b, TINY) != 0:
        assert time.monotonic() < deadline, "B still serves a request nobody reads"
        time.sleep(0.05)


class _CountingPeer(http.server.BaseHTTPRequestHandler):
    """A peer that counts what it is asked and answers its view subscription: one view,
    then a keepalive every second until the subscriber leaves (or the test ends)."""

    requests: ClassVar[list[str]] = []
    done: ClassVar[threading.Event] = threading.Event()  # the test is over: stop answering
    view = b'{"models_max":4,"models":{"far-model":["loaded",0]},"needs":{},"free":null}\n'

    def do_GET(self) -> None:
        self.requests.append(self.path)
        if self.path != "/peer-view":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(self.view)
            self.wfile.flush()
            while not self.done.wait(1):
                self.wfile.write(b"\n")
                self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_peer_at_rest_is_asked_nothing_after_its_subscription(demo_dir: Path) -> None:
    """Issue 25: peers polled each other's GET /models and /props every second (and /ledger),
    2-3 requests per peer per agent each second. Now one subscription: its view comes when it
    changes, and a newline keeps it alive."""
    # Not daemon threads: server_close() joins them, so no socket outlives the test (one
    # that did was reported, unclosed, in whichever test ran when its thread ended).
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingPeer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    peer = f"http://127.0.0.1:{server.server_address[1]}"
    agent = AgentProcess(["--models-dir", str(demo_dir), "--peer", peer, "--log-level", "debug"])
    try:
        deadline = time.monotonic() + 30
        while f"peer {peer} answers (1 models)" not in agent.log():
            assert time.monotonic() < deadline, agent.log()[-2000:]
            time.sleep(0.1)
        time.sleep(5)
        assert _CountingPeer.requests == ["/peer-view"], (_CountingPeer.requests, agent.log())
    finally:
        agent.stop()
        _CountingPeer.done.set()
        server.shutdown()
        server.server_close()
