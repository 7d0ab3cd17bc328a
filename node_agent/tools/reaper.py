"""The process between the agent and a program a tool runs on the host, so that the program's
processes die with it, those that left its process group or session too (``setsid sleep 777
&`` outlived the tool's timeout and the agent: issue 26, row 13).

It is a child subreaper (``PR_SET_CHILD_SUBREAPER``): whatever the program starts and leaves
behind is reparented to it, not to init, wherever it moved. It starts the program, and when
the program ends, or when the reaper gets SIGTERM (the tool's timeout, its client gone, the
agent's shutdown; the agent's death too, through ``PR_SET_PDEATHSIG``), it kills every process
left below it and only then exits, with the program's exit code (1 for a program killed by a
signal, as ``process.run_program`` reports one).

The standard library only: the agent runs it isolated (``python -I -S``), with argv ``PACKAGE
STATUS_FD CWD PROGRAM ARGS…``; a program that cannot be started is reported on ``STATUS_FD``
(``spawn``), so that the tool says "failed to spawn process" as llama.cpp does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SWEEP_PAUSE = 0.01  # seconds between two rounds of killing what is left


class _Stop(Exception):
    """SIGTERM, SIGINT or SIGHUP: end the program and everything below it now."""


_stopping = False


def _stop(signum: int, frame: FrameType | None) -> None:
    # Once: a second signal that came while the first's _Stop left the wait (an agent killed
    # sends its PR_SET_PDEATHSIG, and others may follow) raised again in the clean-up, and the
    # reaper died before its sweep.
    global _stopping
    if not _stopping:
        _stopping = True
        raise _Stop


def _children() -> list[int]:
    """This process's children: the program, and whatever was orphaned below it."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid …: comm may hold spaces and parentheses
        fields = stat.rpartition(b")")[2].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def sweep() -> None:
    """Kill every process below this one, round after round (a killed process's children are
    orphaned to this one), until none is left."""
    while kids := _children():
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(SWEEP_PAUSE)
        _reap()


def _wait_for(pid: int) -> int:
    """The program's exit code; orphans that end meanwhile are reaped as they come."""
    while True:
        done, status = os.wait()
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def main() -> None:
    global _stopping
    status_fd, cwd, *argv = sys.argv[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    code = 1
    try:
        # Linux 3.4 and later; should it fail, the sweep still ends the program's children
        # and the agent's kill of the process group the rest (nothing is written: the output
        # is the program's).
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        try:
            # stdin, stdout and stderr are the program's; our copies go below
            program = subprocess.Popen(argv, cwd=cwd or None, restore_signals=True)
        except (OSError, ValueError):
            os.write(int(status_fd), b"spawn")
            return
        os.close(int(status_fd))
        # Our copies of the output pipe would keep the agent from seeing its end.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        code = _wait_for(program.pid)
        program.returncode = code  # waited for here: Popen must not wait again
    except _Stop:
        pass
    finally:
        _stopping = True  # the program ended by itself: a signal now changes nothing either
        sweep()
    sys.exit(code if code >= 0 else 1)
