#!/usr/bin/env python3
"""Acceptance 16.3: /health latency and the agent's memory under the issue's three attacks,
with the agent's default limits (``--client-timeout 30``, ``--max-connections`` from
``ulimit -n``, here 512 as in the issue).

Usage: ``hack/attack-figures.py [--models DIR]`` (default: generate the demo models in a
temporary folder). Prints one line per attack. The attacks are ``tests/integration/attacks.py``
(the integration tests run them with short limits and assert the outcome).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_agent.demo_models import write_demo_models
from tests.integration.attacks import (
    Probe,
    big_body,
    is_open,
    post_raw,
    slow_connections,
    stalled_stream,
)
from tests.integration.harness import AgentProcess, chat

NOFILE = 512


def agent(models: Path, *extra: str) -> AgentProcess:
    # The agent inherits this process's descriptor limit: the issue's `ulimit -n 512`.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        return AgentProcess(["--models-dir", str(models), *extra])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def slowloris(models: Path) -> None:
    a = agent(models)
    try:
        probe = Probe(a.port, a.proc.pid, interval=0.5)
        with probe.running():
            socks = slow_connections(a.port, idle=300, slow_head=300, slow_body=300)
            start = time.monotonic()
            time.sleep(2)
            open_at_2s = sum(map(is_open, socks))
            while any(map(is_open, socks)) and time.monotonic() - start < 120:
                time.sleep(1)
            gone = time.monotonic() - start
            left = sum(map(is_open, socks))
        print(
            f"slowloris (900 connections tried, {len(socks)} opened, ulimit -n {NOFILE}, "
            f"default limits): {open_at_2s} still open after 2 s, {left} after {gone:.0f} s; "
            f"{probe.summary()}"
        )
        for s in socks:
            s.close()
    finally:
        a.proc.terminate()
        a.proc.wait()


def non_readers(models: Path) -> None:
    a = agent(models, "-np", "2", "-c", "8192", "--queue-timeout", "5", "--max-queue", "1")
    try:
        assert a.post("/v1/chat/completions", chat("demo-tiny"))[0] == 200
        probe = Probe(a.port, a.proc.pid, interval=0.5)
        with probe.running():
            socks = [stalled_stream(a.port, "demo-tiny", 4000) for _ in range(2)]
            time.sleep(1)
            queued_seen = 0
            start = time.monotonic()
            status, _ = a.post("/v1/chat/completions", chat("demo-tiny"))
            normal = time.monotonic() - start
            while a.models()["demo-tiny"]["corral"]["in_flight"] and time.monotonic() < start + 120:
                queued_seen = max(queued_seen, a.models()["demo-tiny"]["corral"]["queued"])
                time.sleep(0.5)
            freed = time.monotonic() - start
        print(
            f"non-readers (-np 2, 2 streams never read, --queue-timeout 5 --max-queue 1): "
            f"a normal request got {status} after {normal:.1f} s; the slots were free again "
            f"{freed:.0f} s later; {probe.summary()}"
        )
        for s in socks:
            s.close()
    finally:
        a.proc.terminate()
        a.proc.wait()


def large_body(models: Path) -> None:
    a = agent(models, "--no-models-autoload")
    try:
        body = big_body("demo-tiny", 60 * 1000 * 1000)
        probe = Probe(a.port, a.proc.pid, interval=0.05)
        with probe.running():
            status, took = post_raw(a.port, "/v1/chat/completions", body)
        print(
            f"60 MB body of {{}} items (--max-body-size 64MiB): answered {status} in "
            f"{took:.1f} s; {probe.summary()}"
        )
    finally:
        a.proc.terminate()
        a.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = args.models or Path(tmp)
        if args.models is None:
            write_demo_models(models)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the attacker's sockets
        for attack in (slowloris, non_readers, large_body):
            attack(models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
