"""The built-in tools' parts that run programs and threads (node_agent.tools): bounded
programs, the ``--tools-runtime`` container's respawn and close with a fake ``docker`` on PATH,
and the tools' own thread pool. (In tests/integration: they start processes and wait for them;
the pure parts are in tests/unit/test_builtin_tools.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from node_agent.tools.builtin import TOOLS
from node_agent.tools.container import ContainerRuntime
from node_agent.tools.grep import GREP_WORKERS
from node_agent.tools.names import ContainerSpec
from node_agent.tools.process import run_program
from node_agent.tools.toolbox import Toolbox, ToolboxClosed
from tests.integration.attacks import processes_with


@pytest.fixture(params=[False, True], ids=["group", "reaper"])
def reap(request: pytest.FixtureRequest) -> bool:
    """Each program test without and with the reaper (``process.run_program(reap=…)``)."""
    value: bool = request.param
    return value


async def test_a_program_output_is_bounded_and_drained(reap: bool) -> None:
    res = await run_program(["sh", "-c", "seq 1 100000; echo done >&2"], 10, 30, reap=reap)
    assert res.output == b"1\n2\n3\n4\n5\n\n[output truncated]" and res.exit_code == 0


async def test_a_program_past_its_time_is_killed_with_its_children(
    tmp_path: Path, reap: bool
) -> None:
    marker = tmp_path / "late"
    started = time.monotonic()
    res = await run_program(
        ["sh", "-c", f"(sleep 3; touch {marker}) & sleep 30"], 100, 0.5, reap=reap
    )
    assert res.timed_out and res.exit_code == 1  # killed: subprocess.h's EXIT_FAILURE
    assert time.monotonic() - started < 10
    await asyncio.sleep(3.5)
    assert not marker.exists()  # the background child went with the group


async def test_a_program_that_closed_its_output_is_killed_at_its_time(
    tmp_path: Path, reap: bool
) -> None:
    started = time.monotonic()
    res = await run_program(
        ["sh", "-c", f"exec > {tmp_path / 'log'} 2>&1; sleep 30"], 100, 0.5, reap=reap
    )
    assert res.timed_out and res.exit_code == 1
    assert time.monotonic() - started < 10


async def test_a_program_that_cannot_start(reap: bool) -> None:
    res = await run_program(["/no/such/program"], 100, 5, reap=reap)
    assert (res.output, res.exit_code) == (b"failed to spawn process", -1)
    res = await run_program(["true"], 100, 5, cwd="/no/such/folder", reap=reap)
    assert res.exit_code == -1


async def test_stdin_reaches_the_program_and_a_stopped_reader_ends_it(reap: bool) -> None:
    res = await run_program(["cat"], 100, 5, stdin_data=b"piped", reap=reap)
    assert res.output == b"piped"
    seen: list[bytes] = []

    async def stop_after_first(chunk: bytes) -> bool:
        seen.append(chunk)
        return False

    started = time.monotonic()
    res = await run_program(
        ["sh", "-c", "echo hi; sleep 30"], 100, 60, on_chunk=stop_after_first, reap=reap
    )
    assert seen == [b"hi\n"] and time.monotonic() - started < 10


async def test_under_the_reaper_a_new_sessions_processes_die_with_the_program(
    tmp_path: Path,
) -> None:
    """Issue 26, row 13: ``setsid`` leaves the process group that the timeout kills."""
    marker = tmp_path / "late"
    script = f"setsid sh -c 'sleep 2; touch {marker}' </dev/null >/dev/null 2>&1 &"
    res = await run_program(["sh", "-c", script + " echo started"], 100, 30, reap=True)
    assert (res.output, res.exit_code, res.timed_out) == (b"started\n", 0, False)
    res = await run_program(["sh", "-c", script + " sleep 30"], 100, 0.5, reap=True)
    assert res.timed_out
    call = asyncio.ensure_future(
        run_program(["sh", "-c", script + " sleep 30"], 100, 30, reap=True)
    )
    await asyncio.sleep(1)
    call.cancel()  # the client or the agent went away
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(2.5)
    assert not marker.exists()


def _children_of(parent: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):  # gone meanwhile
            # pid (comm) state ppid …: comm may hold spaces and parentheses
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[
                1
            ] == str(parent):
                found.add(int(entry.name))
    return found


async def test_a_call_cancelled_while_its_program_starts_ends_what_the_program_started(
    tmp_path: Path,
) -> None:
    """Found by a CI run: an agent stopped just as a tool call began (asyncio still connecting
    the reaper's pipes) left the command's ``setsid`` child running. asyncio's own clean-up of
    a half-made subprocess SIGKILLs that process alone, so the reaper died before its sweep.
    The loop is held here while the program starts, so the cancellation lands in that window."""
    marker = tmp_path / "late"
    script = f"setsid sh -c 'sleep 2; touch {marker}' </dev/null >/dev/null 2>&1 & sleep 30"
    before = _children_of(os.getpid())
    call = asyncio.ensure_future(run_program(["sh", "-c", script], 100, 30, reap=True))
    deadline = time.monotonic() + 20
    # One step at a time, until the reaper is forked (asyncio then connects its pipes).
    while not _children_of(os.getpid()) - before and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0)
    (reaper,) = _children_of(os.getpid()) - before
    while not _children_of(reaper) and time.monotonic() < deadline:
        time.sleep(0.01)  # noqa: ASYNC251 (the loop held while the reaper starts the program)
    assert _children_of(reaper), "the reaper never started the program"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(2.5)
    assert not marker.exists()


async def test_under_the_reaper_the_exit_code_is_the_programs() -> None:
    assert (await run_program(["sh", "-c", "exit 7"], 100, 5, reap=True)).exit_code == 7
    res = await run_program(["sh", "-c", "kill -9 $$"], 100, 5, reap=True)
    assert res.exit_code == 1  # killed by a signal: subprocess.h's EXIT_FAILURE


async def test_a_glob_past_its_time_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.txt").touch()
    monkeypatch.setattr("node_agent.tools.builtin.GLOB_TIMEOUT", 0)
    (glob,) = (t for t in TOOLS if t.name == "file_glob_search")
    assert await glob.invoke({"path": str(tmp_path)}, None) == {
        "error": "glob matching timed out after 0 s (1 entries): narrow the path or simplify "
        "the include/exclude patterns"
    }


def grep_workers() -> int:
    """The grep_search worker processes running now."""
    count = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            count += b"node_agent.tools.grep_worker" in (entry / "cmdline").read_bytes()
    return count


async def test_backtracking_greps_run_a_few_bounded_workers_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, row 1: each runs in a process of its own (``re`` holds the GIL), killed at
    its time bound; concurrent calls share GREP_WORKERS processes."""
    for module in ("grep", "builtin"):
        monkeypatch.setattr(f"node_agent.tools.{module}.GREP_TIMEOUT", 1.5)
    (tmp_path / "a.txt").write_text("a" * 40 + "\n")
    (grep,) = (t for t in TOOLS if t.name == "grep_search")
    params = {"path": str(tmp_path), "pattern": "(a+)+$b"}
    calls = asyncio.gather(*(grep.invoke(params, None) for _ in range(2 * GREP_WORKERS)))
    most = 0
    while not calls.done():
        most = max(most, grep_workers())
        await asyncio.sleep(0.1)
    assert 0 < most <= GREP_WORKERS
    for answer in calls.result():
        assert answer["error"].startswith("grep_search timed out after 1.5 s (0 of 1 files")
    assert grep_workers() == 0


FAKE_RUN = """#!/bin/sh
# docker run --rm -i --cidfile FILE IMAGE sh: a container id a while after it started
touch "$STARTED_DIR/$$"
sleep 1
echo "cid$$" > "$5"
exec cat > /dev/null
"""


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``docker`` on PATH; the folder where each ``run`` leaves its pid."""
    (tmp_path / "docker").write_text(FAKE_RUN)
    (tmp_path / "docker").chmod(0o755)
    folder = tmp_path / "started"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("STARTED_DIR", str(folder))
    return folder


def runs(started: Path) -> set[int]:
    """The pids of the fake ``docker run``s started so far."""
    return {int(p.name) for p in started.iterdir()}


async def test_a_respawn_that_its_client_left_is_not_left_half_done(started: Path) -> None:
    """aiohttp cancels the handler of a client that went away; the respawn goes on."""
    runtime = ContainerRuntime(ContainerSpec("docker", "img", False))
    await runtime.start()
    (pid,) = runs(started)
    assert await runtime.spec() == f"docker-container:cid{pid}"
    os.kill(pid, signal.SIGKILL)  # the container died
    for _ in range(100):
        await asyncio.sleep(0.05)
        if runtime._proc is not None and runtime._proc.returncode is not None:
            break
    call = asyncio.ensure_future(runtime.spec())
    for _ in range(1000):  # the new `docker run` runs: then its client leaves
        await asyncio.sleep(0.02)
        if len(runs(started)) == 2:
            break
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    try:
        (respawned,) = runs(started) - {pid}  # none orphaned
        assert await runtime.spec() == f"docker-container:cid{respawned}"
    finally:
        await runtime.close()


async def test_no_container_is_started_once_the_toolbox_closes(started: Path) -> None:
    toolbox = Toolbox(("get_info",), "docker:img")
    await toolbox.start()
    assert len(runs(started)) == 1
    await toolbox.close()
    with pytest.raises(ToolboxClosed):  # a call in the shutdown's window
        await toolbox.runtime_spec()
    assert len(runs(started)) == 1


async def test_tool_calls_that_never_end_stall_only_the_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def stuck(*_: object) -> list[object]:  # like a glob over a listing that never ends
        release.wait()
        return []

    monkeypatch.setattr("node_agent.tools.builtin._matching", stuck)
    (glob,) = (t for t in TOOLS if t.name == "file_glob_search")
    calls = [asyncio.ensure_future(glob.invoke({"path": str(tmp_path)}, None)) for _ in range(40)]
    try:
        await asyncio.sleep(1)  # they hold every thread they can get
        assert await asyncio.wait_for(asyncio.to_thread(sum, [1, 2]), 10) == 3
    finally:
        release.set()
        await asyncio.gather(*calls)


def test_the_reaper_sweeps_once_whatever_signals_follow_the_first(tmp_path: Path) -> None:
    """A second stop signal that came while the reaper left its wait for the first (the agent
    killed: its PR_SET_PDEATHSIG, and another) ended the reaper before its sweep, and the
    command's ``setsid`` child lived on (1 agent kill in 10 under uvloop, 1 in 25 without)."""
    import subprocess
    import sys

    from node_agent.tools.process import _PACKAGE_PARENT, _REAPER

    for attempt in range(10):
        tag = f"777.{os.getpid()}{attempt}"
        read, write = os.pipe()
        command = f"setsid sleep {tag} </dev/null >/dev/null 2>&1 & sleep 60"
        reaper = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                "-c",
                _REAPER,
                _PACKAGE_PARENT,
                str(write),
                "",
                "sh",
                "-c",
                command,
            ],
            pass_fds=(write,),
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(write)
        os.read(read, 1)  # the reaper closes it once the program runs
        os.close(read)
        argv = f"sleep\x00{tag}\x00".encode()
        deadline = time.monotonic() + 10
        while not processes_with(argv) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert processes_with(argv), "the command never started"
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            reaper.send_signal(sig)
        assert reaper.wait(10) == 1
        left = processes_with(argv)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert left == [], f"attempt {attempt}: the setsid child outlived the reaper"
