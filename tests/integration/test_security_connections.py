"""Issue 16 rows 6–8 against a real agent: slow, silent, greedy and non-reading clients.

Each test runs an attack from ``attacks.py`` with short limits (``--client-timeout 2``) and
prints the figures acceptance 16.3 asks for (``/health`` latency, the agent's RSS); the same
attacks with the default limits are ``hack/attack-figures.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from node_agent.api.connections import GRACE_SECONDS
from tests.integration.attacks import (
    Probe,
    big_body,
    health_once,
    is_open,
    post_raw,
    slow_connections,
    stalled_stream,
)
from tests.integration.harness import chat

CLIENT_TIMEOUT = 2.0


@contextlib.contextmanager
def closing_all(sockets: list[socket.socket]) -> Iterator[None]:
    """Close the attack's sockets however the test ends (a leak fails a later test)."""
    try:
        yield
    finally:
        for s in sockets:
            s.close()


def wait_for(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_row_6_slow_and_idle_connections_are_closed_and_health_keeps_answering(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent(
        "--models-dir",
        str(demo_dir),
        "--client-timeout",
        str(CLIENT_TIMEOUT),
        "--max-connections",
        "48",
    )
    probe = Probe(agent.port, agent.proc.pid)
    sockets: list[socket.socket] = []
    with probe.running(), closing_all(sockets):
        sockets += slow_connections(agent.port, idle=50, slow_head=50, slow_body=50)
        # Past the grace a fresh connection gets before it counts as idle (connections.py).
        time.sleep(GRACE_SECONDS + 0.5)
        # Over the bound (150 > 48): idle and slow ones were closed for newcomers ...
        assert sum(map(is_open, sockets)) <= 48
        # ... so /health answers while the bound is full of them. (A probe that connects in
        # the burst's first second may be the one that makes room: the summary counts those.)
        assert all(health_once(agent.port) < 10 for _ in range(10))
        # ... and the rest go once the client timeout has passed.
        wait_for(lambda: not any(map(is_open, sockets)), CLIENT_TIMEOUT * 10)
    print(f"\nrow 6 (150 slow/idle, --max-connections 48): {probe.summary()}")


def test_row_7_a_client_that_does_not_read_is_queued_and_cut_off(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent(
        "--models-dir",
        str(demo_dir),
        "-np",
        "2",
        "-c",
        "8192",
        "--client-timeout",
        "6",
        "--queue-timeout",
        "2",
        "--max-queue",
        "1",
    )
    assert agent.post("/v1/chat/completions", chat("demo-tiny"))[0] == 200  # loaded
    probe = Probe(agent.port, agent.proc.pid)
    stalled: list[socket.socket] = []
    with probe.running(), closing_all(stalled):
        stalled += [stalled_stream(agent.port, "demo-tiny", 4000) for _ in range(2)]
        queued: list[int] = []

        def watch() -> None:
            for _ in range(20):
                queued.append(agent.models()["demo-tiny"]["corral"]["queued"])
                time.sleep(0.1)

        # Both slots held by the non-readers (leased a moment after their requests are sent).
        wait_for(lambda: agent.models()["demo-tiny"]["corral"]["in_flight"] == 2, 30)
        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.monotonic()
        status, body = agent.post("/v1/chat/completions", chat("demo-tiny"))
        waited = time.monotonic() - started
        watcher.join()
        assert status == 503 and "slots of its server stayed busy" in body["error"]["message"]
        assert max(queued) == 1  # the gate counts as queue
        # The non-readers are cut off once they took nothing for the client timeout, which
        # frees the slots they held.
        wait_for(lambda: agent.models()["demo-tiny"]["corral"]["in_flight"] == 0, 6 + 30)
        assert "the client took no data for 6s (--client-timeout): cutting it off" in agent.log()
        assert agent.post("/v1/chat/completions", chat("demo-tiny"))[0] == 200
    print(f"\nrow 7 (-np 2, 2 non-readers, 503 after {waited:.1f} s): {probe.summary()}")


def test_row_8_a_large_body_does_not_stall_other_clients(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--no-models-autoload")
    body = big_body("demo-tiny", 60 * 1000 * 1000)
    probe = Probe(agent.port, agent.proc.pid, interval=0.02)
    with probe.running():
        status, took = post_raw(agent.port, "/v1/chat/completions", body)
    assert status == 400  # the model is not loaded (autoload off): parsed, then refused
    print(f"\nrow 8 (60 MB of {{}} items, answered in {took:.2f} s): {probe.summary()}")
    # Parsed in a thread: /health answered all along, far faster than the body took.
    assert max(probe.latencies) < took / 2
