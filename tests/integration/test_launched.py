"""A started child as its supervisor drives it (``child/launched.py``), with real processes:
its group and session, its exit, its stdin and its signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace
from typing import Any

import pytest

from node_agent.child import launched
from node_agent.child.launched import Launched, launch

pytestmark = [pytest.mark.usefixtures("no_leaked_tasks"), pytest.mark.timeout(60)]

# Echoes one line of its stdin, then exits with 3; on EOF, exits with 4.
ECHO = (
    "import sys\nline = sys.stdin.readline()\nprint(line.strip(), flush=True)\n"
    "sys.exit(3 if line else 4)"
)


def _open_fds() -> set[str]:
    """The process's open descriptors. Tests compare them as "none opened since", never as
    equal: the process may close one of its own meanwhile (a collected leftover of an earlier
    test closed fd 31 during one CI run)."""
    return set(os.listdir("/proc/self/fd"))


def _start(code: str) -> tuple[Launched, int]:
    read_end, write_end = os.pipe()
    try:
        child = launch([sys.executable, "-c", code], os.environ, write_end)
    finally:
        os.close(write_end)
    return child, read_end


async def test_a_child_takes_its_stdin_and_its_exit_is_awaited() -> None:
    child, err = _start(ECHO)
    try:
        assert os.getpgid(child.pid) == child.pid  # its own group
        assert os.getsid(child.pid) == os.getsid(0)  # in our session
        assert child.returncode is None
        assert child.write_stdin(b"exit please\n")
        assert await asyncio.wait_for(child.wait(), 10) == 3
        assert child.returncode == 3
        assert await asyncio.to_thread(child.stdout.read) == b"exit please\n"
        # Gone: nothing more is written, and no signal reaches its pid (perhaps another's).
        assert not child.write_stdin(b"again\n")
        child.send_signal(signal.SIGKILL)
        child.kill_group(signal.SIGKILL)
    finally:
        child.stdout.close()
        os.close(err)


async def test_a_killed_group_ends_the_child_and_what_it_started() -> None:
    # The child starts a grandchild in its group, prints its pid and waits.
    code = textwrap.dedent(
        """
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(grandchild.pid, flush=True)
        time.sleep(60)
        """
    )
    child, err = _start(code)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 10)
        grandchild = int(line)
        child.kill_group(signal.SIGKILL)
        assert await asyncio.wait_for(child.wait(), 10) == -signal.SIGKILL
        assert await asyncio.to_thread(_gone_within, grandchild, 10)
    finally:
        child.stdout.close()
        os.close(err)


async def _reaped_by_the_loop() -> None:
    child, err = _start("pass")  # exits at once
    try:
        deadline = time.monotonic() + 10
        # The loop held, as between kill_group's check and its signal, and long enough for
        # another thread to reap the child meanwhile.
        while _state(child.pid) not in ("Z", None) and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251
        time.sleep(0.2)  # noqa: ASYNC251
        assert _state(child.pid) == "Z", "reaped behind the loop's back"
        assert child.returncode is None
        assert await asyncio.wait_for(child.wait(), 10) == 0
        assert child.returncode == 0
        assert _state(child.pid) is None
    finally:
        child.stdout.close()
        os.close(err)


async def test_a_child_is_reaped_by_the_loop_alone() -> None:
    """send_signal and kill_group check that the child has not been reaped, then signal its
    pid (the number of its group): reaped by another thread in between, it could be another
    process's by then. So the loop reaps it: until the loop has taken its exit, the child stays
    a zombie, which holds its pid and its group's number."""
    await _reaped_by_the_loop()


def test_under_uvloop_a_child_is_reaped_by_the_loop_alone() -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_reaped_by_the_loop())


async def test_a_child_that_cannot_be_watched_is_not_left_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its reaper thread cannot start (``can't start new thread``: a limit on threads, or no
    memory for one's stack) after the child has: launch() fails, and nothing watches the
    child. It must not run on, unsupervised, holding a port, with its pipes open."""
    started: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen[bytes]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    class NoThread:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(launched.subprocess, "Popen", Recorded)
    monkeypatch.setattr(launched, "threading", SimpleNamespace(Thread=NoThread))
    before = _open_fds()
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            launch([sys.executable, "-c", "import time; time.sleep(60)"], os.environ, write_end)
    finally:
        os.close(write_end)
        os.close(read_end)
    [popen] = started
    try:
        assert popen.returncode == -signal.SIGKILL  # ended and reaped
        assert popen.stdin is not None and popen.stdin.closed
        assert popen.stdout is not None and popen.stdout.closed
        assert _open_fds() - before == set()
    finally:  # before the fix: end it here, so that it leaks nothing into later tests
        if popen.returncode is None:
            popen.kill()
        with popen:
            pass


def test_a_child_that_outlives_its_loop_is_reaped_and_its_stdin_closed() -> None:
    """The loop closes before the child exits (a test's loop; an agent's forced shutdown): the
    child is still reaped, not left a zombie, and its stdin pipe is not left open (a
    ResourceWarning when it is collected, an error under pytest)."""
    before = _open_fds()

    def left_open() -> list[str]:
        return sorted(_open_fds() - before)

    async def start() -> Launched:
        child, err = _start("import time; time.sleep(0.5)")
        os.close(err)
        return child

    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        child = runner.run(start())
    child.stdout.close()
    try:
        deadline = time.monotonic() + 5
        while left_open() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert left_open() == []
        assert _state(child.pid) is None
        assert child.returncode == 0
    finally:  # before the fix: closed here, so that no later test gets its ResourceWarning
        child._stdin.close()


def test_a_ctrl_c_in_the_agents_terminal_does_not_reach_a_child() -> None:
    """A terminal sends Ctrl-C's SIGINT to its foreground process group: the agent's. A child
    in a group of its own does not get it (the agent decides when its children stop)."""
    agent = textwrap.dedent(
        """
        import asyncio, os, signal, sys
        from node_agent.child.launched import Launched, launch
        # This stand-in agent lives on (a handler: an ignored signal would stay ignored in
        # the child too).
        signal.signal(signal.SIGINT, lambda *_: None)
        async def main():
            child = launch([sys.executable, "-c", "import time; time.sleep(60)"], os.environ, 2)
            print(child.pid, flush=True)
            sys.stdin.readline()
            child.kill_group(signal.SIGKILL)
            print(await child.wait(), flush=True)
        asyncio.run(main())
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", agent],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job has
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        child = int(proc.stdout.readline())
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        time.sleep(0.3)
        assert _alive(child)  # Python's default SIGINT handling would have ended it
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == str(-signal.SIGKILL)
        assert proc.wait(timeout=10) == 0


def _alive(pid: int) -> bool:
    return _state(pid) not in ("Z", None)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _state(pid: int) -> str | None:
    """``pid``'s state (``Z``: exited, not reaped yet); None once it has been reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None
