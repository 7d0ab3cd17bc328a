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
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node_agent.demo_models import write_demo_models
from tests.integration.attacks import (
    Probe,
    big_body,
    is_open,
    post_raw,
    slow_connections,
    stalled_stream,
    status_kib,
)
from tests.integration.harness import AgentProcess, chat, http

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
        for attack in (slowloris, non_readers, large_body, *TOOL_ATTACKS):
            attack(models)
    return 0


# --- Issue 26, rows 1, 11, 13 and 14: what a tool call sends ----------------------------------
# Each line: the attack's outcome, then the worst /health time another client saw meanwhile and
# the agent's RSS growth (goal: under 250 ms and 64 MiB). tests/integration/test_tools_attacks.py
# runs the same attacks and asserts the outcome.


def _stop_hard(a: AgentProcess) -> None:
    """SIGTERM, then SIGKILL after 15 s (a frozen loop never handles SIGTERM)."""
    a.proc.terminate()
    try:
        a.proc.wait(15)
    except subprocess.TimeoutExpired:
        a.proc.kill()
        a.proc.wait()


def _tool(a: AgentProcess, name: str, params: dict[str, Any]) -> tuple[str, float]:
    """The answer (cut to 100 characters) and how many seconds it took; 70 s at most."""
    start = time.monotonic()
    try:
        _, body = http("POST", f"{a.url}/tools", {"tool": name, "params": params}, timeout=70)
        answer = json.dumps(body)[:100]
    except OSError as exc:
        answer = f"no answer ({exc})"
    return answer, time.monotonic() - start


def _probed(a: AgentProcess, *calls: tuple[str, dict[str, Any]]) -> str:
    """Tool calls, one after the other, while a probe times /health every 100 ms: their
    answers and the figures, as one line."""
    before = status_kib(a.proc.pid, "VmRSS")
    probe = Probe(a.port, a.proc.pid, interval=0.1)
    with probe.running():
        answers = [_tool(a, name, params) for name, params in calls]
    failed = sum(1 for x in probe.latencies if x == float("inf"))
    worst = max(probe.latencies) * 1000
    growth = (max(probe.rss_kib) - before) / 1024
    said = "; ".join(f"answered {answer} in {took:.1f} s" for answer, took in answers)
    return (
        f"{said}; worst /health {worst:.0f} ms ({failed} of {len(probe.latencies)} probes "
        f"failed), RSS growth {growth:.1f} MiB"
    )


def tool_grep_backtracking(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "a.txt").write_text("a" * 40 + "\n")
        a = agent(models, "--tools", "all")
        try:
            figures = _probed(a, ("grep_search", {"path": tmp, "pattern": "(a+)+$b"}))
        finally:
            _stop_hard(a)
    print(f"row 1, grep_search (a+)+$b over a line of 40 a: {figures}")


def tool_edits_and_glob(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp, "big.txt")
        line = "x" * 90 + "\n"
        big.write_text("".join(f"<m{i}>{line}" if i % 500 == 0 else line for i in range(110_000)))
        edits = [{"old_text": f"<m{i}>", "new_text": f"<M{i}>"} for i in range(0, 100_000, 500)]
        files = Path(tmp, "files")
        files.mkdir()
        for i in range(1400):
            (files / f"file-{i:04d}-{'y' * 40}.txt").touch()
        a = agent(models, "--tools", "all")
        try:
            edited = _probed(a, ("edit_file", {"path": str(big), "edits": edits}))
            include = "*a" * 300
            globbed = _probed(a, ("file_glob_search", {"path": str(files), "include": include}))
        finally:
            _stop_hard(a)
    print(f"row 14, edit_file with 200 edits on a 10 MB file: {edited}")
    print(f"row 14, file_glob_search with a 600-token glob over 1,400 files: {globbed}")


def _sleepers(argv: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry / "cmdline").read_bytes() == argv:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def tool_setsid_children(models: Path) -> None:
    a = agent(models, "--tools", "all")
    timed, stopped = b"sleep\x00777.5\x00", b"sleep\x00777.6\x00"
    try:
        params = {"command": "setsid sleep 777.5 & echo x", "timeout": 2}
        figures = _probed(a, ("exec_shell_command", params))
        time.sleep(1)
        after_timeout = len(_sleepers(timed))
        command = "setsid sleep 777.6 </dev/null >/dev/null 2>&1 & sleep 60"
        params = {"command": command, "timeout": 60}
        caller = threading.Thread(target=_tool, args=(a, "exec_shell_command", params))
        caller.start()
        deadline = time.monotonic() + 20
        while not _sleepers(stopped) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        _stop_hard(a)
    time.sleep(1)
    after_shutdown = len(_sleepers(stopped))
    for pid in _sleepers(timed) + _sleepers(stopped):
        os.kill(pid, signal.SIGKILL)
    caller.join()
    print(
        f"row 13, exec_shell_command 'setsid sleep 777 &': {after_timeout} left after the "
        f"tool's timeout, {after_shutdown} after the agent's shutdown; {figures}"
    )


LOUD_MCP = """\
import json, sys
loud = True
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}}
    elif msg["method"] == "tools/list":
        result = {"tools": [{"name": "ping", "description": "pong", "inputSchema": {}}]}
    else:
        if loud:  # one line over the agent's 8 MiB, then more than a pipe and a buffer hold
            sys.stderr.write("x" * (9 * 1024 * 1024) + "\\n")
            for i in range(20_000):
                sys.stderr.write(f"line {i} " + "y" * 1000 + "\\n")
            loud = False
        sys.stderr.write("z" * 100_000 + "\\n")
        result = {"content": [{"type": "text", "text": "pong"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def mcp_long_stderr_line(models: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "loud.py")
        script.write_text(LOUD_MCP)
        servers = {"loud": {"command": sys.executable, "args": [str(script)], "timeout_ms": 10_000}}
        a = agent(models, "--mcp-servers-json", json.dumps({"mcpServers": servers}))
        try:
            figures = _probed(a, *[("loud_ping", {})] * 3)
        finally:
            _stop_hard(a)
    print(
        f"row 11, an MCP server writes one 9 MiB stderr line at its first call, 3 calls: {figures}"
    )


TOOL_ATTACKS = (
    tool_grep_backtracking,
    mcp_long_stderr_line,
    tool_setsid_children,
    tool_edits_and_glob,
)


if __name__ == "__main__":
    sys.exit(main())
