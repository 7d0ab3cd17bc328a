"""A started child as its supervisor drives it: its exit awaited on the event loop, its
signals, and the exit command written to its stdin.

A child gets a process group of its own (a stop SIGKILLs everything it started; a terminal's
Ctrl-C goes to the foreground group, not to it, and the agent decides) in the agent's own
session. Not a session of its own: Linux's scheduler gives each session an equal share of the
cores (autogroups, on by default wherever no cgroup takes that role, as on most desktops), so
a child computing on every core got as much as the agent and all else in its session
together, and the agent, woken by its child's tokens, waited for a core. Measured (``perf
sched``, a 2-core machine, the agent sharing its session with a client): a scheduling delay of
82 ms, and streams that reached the client in one piece at their end (15 and 17 in 40 paused
over 30 ms; none with the child in the agent's session, where llama.cpp's router keeps its
children too).

uvloop's subprocesses cannot have a group without a session but through a ``preexec_fn``
(libuv knows only ``setsid``), which forces a fork, so the child is started with
``subprocess.Popen(process_group=0)`` (vfork and exec: 1.3-2.3 ms a spawn on the loop, against
4.9-5.5 ms with uvloop's own, measured; a fork where no ``setpriv`` sets the parent-death
signal and a ``preexec_fn`` must), a thread waits for its exit, and the loop reaps it
(``Launched._reap`` says why there).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO


class Launched:
    """A running child (see the module's docstring): ``stdout`` is the read end of its
    stdout, for the caller to read; its stdin stays open while it runs (llama-server in child
    mode exits when its stdin closes)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdin is not None and popen.stdout is not None
        self._popen = popen
        self.pid = popen.pid
        self.stdout: IO[bytes] = popen.stdout
        self._stdin = popen.stdin
        os.set_blocking(self._stdin.fileno(), False)  # a write never holds the loop
        loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = loop.create_future()
        threading.Thread(
            target=self._reap, args=(loop,), name=f"reap-{self.pid}", daemon=True
        ).start()

    @property
    def returncode(self) -> int | None:
        """Its exit status once reaped (minus the signal that ended it), else None."""
        return self._popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the child alone; nothing once it has been reaped (its pid may be another
        process's by then)."""
        self._popen.send_signal(sig)

    def kill_group(self, sig: int) -> None:
        """``sig`` to the child's process group (the child and what it started), unless the
        child has been reaped."""
        if self.returncode is None:
            os.killpg(self.pid, sig)

    def write_stdin(self, data: bytes) -> bool:
        """``data`` on the child's stdin, whole, if the pipe takes it now (a command of a few
        bytes into an empty pipe always does); False once the child is gone."""
        if self._stdin.closed:
            return False
        try:
            return os.write(self._stdin.fileno(), data) == len(data)
        except OSError:  # the child closed its stdin, or exited
            return False

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        # Waits for the exit and leaves the child a zombie (WNOWAIT) for the loop to reap:
        # send_signal and kill_group check on the loop that it has not been reaped, then signal
        # its pid and its group's number, which a zombie holds. Reaped here in between, both
        # could be another process's by the time the signal goes.
        if hasattr(os, "waitid"):  # not on macOS: there this thread reaps it
            with contextlib.suppress(ChildProcessError):  # reaped already (send_signal polls)
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
        else:
            self._popen.wait()
        try:
            loop.call_soon_threadsafe(self._exited)
        except RuntimeError:  # the loop is closed (the agent exits; a test's loop ended)
            self._popen.wait()  # no zombie left behind
            self._stdin.close()  # nor an open pipe (nothing on the loop can use it now)

    def _exited(self) -> None:
        code = self._popen.wait()  # at once: it has exited
        self._stdin.close()
        if not self._exit.done():
            self._exit.set_result(code)


def launch(
    argv: Sequence[str],
    env: Mapping[str, str],
    stderr: int,
    preexec: Callable[[], None] | None = None,
) -> Launched:
    """Start ``argv`` with piped stdin and stdout and ``stderr`` (a descriptor) as its
    stderr, in a process group of its own (``preexec``: a ``preexec_fn``, or None)."""
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(env),
        process_group=0,
        preexec_fn=preexec,
    )
    try:
        return Launched(popen)
    except BaseException:
        # Nothing would watch it (its reaper thread could not start, or no loop runs here):
        # not left running unsupervised, its pipes open. Not reaped yet: the group is its own.
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)
        with popen:  # closes its pipes and reaps it
            pass
        raise
