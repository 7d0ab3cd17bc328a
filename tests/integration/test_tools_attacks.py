"""Issue 26's attacks through the tools (rows 1, 11, 13 and 14), against a real agent: nothing a
tool call sends may freeze the agent's loop, hold a tool thread for long, or leave a process
behind. While each attack runs, another client's ``/health`` must stay fast
(``tests/integration/attacks.py``'s ``Probe``); ``hack/attack-figures.py`` prints the same
figures with the issue's sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.mcp.config import McpServerConfig
from node_agent.mcp.stdio import STDERR_LINE_BYTES, StdioSession
from tests.integration.attacks import Probe, processes_with
from tests.integration.harness import AgentProcess
from tests.integration.test_compat import call

HEALTH_BOUND = 0.25  # seconds: issue 26's bound for another client's /health
# The sleeps the commands start are found by their command line, machine-wide: this run's
# own durations (777.<pid><n>), so that a run beside this one, or one just before that left
# its own, is neither counted nor killed.
RUN = os.getpid()


@pytest.fixture
def agent(llama_server: str) -> Iterator[AgentProcess]:
    agent = AgentProcess(["--llama-server", llama_server, "--tools", "all"])
    try:
        yield agent
    finally:
        agent.stop()


def tool(agent: AgentProcess, name: str, params: dict[str, Any]) -> Any:
    answer = call(agent.port, "POST", "/tools", {"tool": name, "params": params})
    assert answer.status == 200, answer
    return answer.json()


def tool_while_probed(
    agent: AgentProcess, name: str, params: dict[str, Any]
) -> tuple[Any, float, Probe]:
    """The tool's answer, how long it took, and ``/health`` as another client saw it
    meanwhile."""
    answers: list[Any] = []
    probe = Probe(agent.port, agent.proc.pid, interval=0.1)
    with probe.running():
        started = time.monotonic()
        caller = threading.Thread(target=lambda: answers.append(tool(agent, name, params)))
        caller.start()
        caller.join(60)
        took = time.monotonic() - started
    assert answers, f"{name} did not answer in 60 s"
    return answers[0], took, probe


def test_a_backtracking_pattern_neither_freezes_the_agent_nor_runs_for_long(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Row 1: ``(a+)+$b`` on a line of 40 ``a`` backtracks for ages; ``re`` holds the GIL."""
    (tmp_path / "a.txt").write_text("a" * 40 + "\n")
    params = {"path": str(tmp_path), "pattern": "(a+)+$b"}
    answer, took, probe = tool_while_probed(agent, "grep_search", params)
    assert "timed out" in answer["error"], answer
    assert took < 20
    assert max(probe.latencies) < HEALTH_BOUND, probe.summary()
    # The agent is whole: the next search answers as before.
    found = tool(agent, "grep_search", {"path": str(tmp_path), "pattern": "a{40}"})
    assert found["plain_text_response"].startswith("a.txt:" + "a" * 40 + "\n"), found


LOUD_MCP = """\
import json, sys
sys.stderr.write("x" * (9 * 1024 * 1024) + "\\n")  # one line over the 8 MiB line bound
for i in range(20_000):  # then 20 MiB more: more than an unread pipe and reader buffer hold
    sys.stderr.write(f"line {i} " + "y" * 1000 + "\\n")
sys.stderr.write("ready\\n")
sys.stderr.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2024-11-05", "capabilities": {}, "serverInfo": {}}
    else:
        sys.stderr.write("z" * 100_000 + "\\n")
        result = {"content": [{"type": "text", "text": "pong"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


async def test_an_mcp_server_writing_a_huge_stderr_line_keeps_working(tmp_path: Path) -> None:
    """Row 11: one stderr line over 8 MiB killed the stderr reader; the server then blocked
    on its next write and every later call timed out."""
    (tmp_path / "loud.py").write_text(LOUD_MCP)
    script = str(tmp_path / "loud.py")
    config = McpServerConfig("loud", sys.executable, (script,), timeout_ms=10_000)
    session = StdioSession(config)
    assert await session.start()
    try:
        for _ in range(3):
            assert await session.call_tool("ping", {}) == {"plain_text_response": "pong"}
        # The over-long lines were cut and read on: the tail (why a server died) has them.
        cut = f"z [{100_000 - STDERR_LINE_BYTES} more bytes cut]\n"
        for _ in range(100):  # stderr has its own reader: it may come after the reply
            if session.diagnostics().endswith(cut):
                break
            await asyncio.sleep(0.05)
        assert session.diagnostics().endswith(cut)
    finally:
        await session.close()


@pytest.fixture
def leftovers() -> Iterator[list[bytes]]:
    """Command lines the test's programs run; any still running at the end are killed."""
    argvs: list[bytes] = []
    yield argvs
    for argv in argvs:
        for pid in processes_with(argv):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def wait_gone(argv: bytes, within: float = 5) -> list[int]:
    deadline = time.monotonic() + within
    while processes_with(argv) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_with(argv)


def test_a_commands_processes_die_with_it_setsid_ones_too(
    agent: AgentProcess, leftovers: list[bytes]
) -> None:
    """Row 13: ``setsid sleep 777 &`` left its own session and outlived the tool's timeout
    (and the agent): the process group kill does not reach it."""
    # The first keeps the output pipe open: the tool runs to its timeout. The second has all
    # its descriptors closed: the shell ends at once.
    holding = f"sleep\x00777.{RUN}1\x00".encode()
    detached = f"sleep\x00777.{RUN}2\x00".encode()
    leftovers.extend([holding, detached])
    started = time.monotonic()
    answer = tool(
        agent,
        "exec_shell_command",
        {"command": f"setsid sleep 777.{RUN}1 & echo started", "timeout": 2},
    )
    assert answer["plain_text_response"].startswith("started\n"), answer
    assert time.monotonic() - started < 10
    assert wait_gone(holding) == []
    command = f"setsid sleep 777.{RUN}2 </dev/null >/dev/null 2>&1 & echo started"
    answer = tool(agent, "exec_shell_command", {"command": command})
    assert answer["plain_text_response"] == "started\n\n[exit code: 0]", answer
    assert wait_gone(detached) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["shutdown", "killed"])
def test_a_commands_processes_die_with_the_agent(
    llama_server: str, leftovers: list[bytes], sig: signal.Signals
) -> None:
    """At the shutdown the call is cancelled; when the agent is killed, the reaper hears it
    (``PR_SET_PDEATHSIG``). Either way it kills everything below it."""
    agent = AgentProcess(["--llama-server", llama_server, "--tools", "exec_shell_command"])
    argv = f"sleep\x00777.{RUN}{sig.value}\x00".encode()
    leftovers.append(argv)
    command = f"setsid sleep 777.{RUN}{sig.value} </dev/null >/dev/null 2>&1 & sleep 60"
    body = {"tool": "exec_shell_command", "params": {"command": command, "timeout": 60}}

    def run() -> None:
        with contextlib.suppress(OSError):  # a killed agent closes the connection
            call(agent.port, "POST", "/tools", body)

    caller = threading.Thread(target=run)
    try:
        caller.start()
        deadline = time.monotonic() + 20
        while not processes_with(argv) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(argv)
        agent.proc.send_signal(sig)
        assert agent.proc.wait(30) == (0 if sig == signal.SIGTERM else -sig)
        assert wait_gone(argv) == []
    finally:
        agent.stop()
        caller.join(30)


def test_many_edits_on_a_large_file_are_quick_and_bounded(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Row 14: 200 edits on a 10 MB file took 40 s of a tool thread (each edit normalised the
    whole file again); past the bounds, a clear error."""
    line = "x" * 90 + "\n"
    big = tmp_path / "big.txt"
    big.write_text("".join(f"<m{i}>{line}" if i % 500 == 0 else line for i in range(110_000)))
    edits = [{"old_text": f"<m{i}>", "new_text": f"<M{i}>"} for i in range(0, 100_000, 500)]
    answer, took, probe = tool_while_probed(agent, "edit_file", {"path": str(big), "edits": edits})
    assert answer["edits_applied"] == 200, answer
    assert took < 10, took
    assert max(probe.latencies) < HEALTH_BOUND, probe.summary()
    assert big.read_text().count("<M") == 200
    too_many = [{"old_text": f"<M{i}>", "new_text": "x"} for i in range(1001)]
    answer = tool(agent, "edit_file", {"path": str(big), "edits": too_many})
    assert answer == {"error": "too many edits (1001, max 1000 per call)"}


def test_a_long_glob_over_many_files_is_refused_at_once(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """Row 14: a 600-token glob over 1,400 files took 4.7 s of a tool thread."""
    for i in range(1400):
        (tmp_path / f"file-{i:04d}-{'y' * 40}.txt").touch()
    include = "*a" * 300
    answer, took, probe = tool_while_probed(
        agent, "file_glob_search", {"path": str(tmp_path), "include": include}
    )
    assert answer == {"error": "include pattern too long (600 characters, max 256)"}
    assert took < 2, took
    assert max(probe.latencies) < HEALTH_BOUND, probe.summary()
