"""Run one program for a tool: bounded output, bounded time, never blocking the event loop.

llama.cpp's ``run_subprocess``: the argv is run as given (no shell unless the argv names one),
stdin gets ``stdin_data`` and is closed, output is read as it comes and kept up to
``max_output`` bytes (then ``[output truncated]``; the rest is drained so the program never
blocks on a full pipe). At the deadline the program is killed and ``timed_out`` is set; a
program killed by a signal reports exit code 1, one that cannot be started -1 with "failed to
spawn process" (``subprocess.h``'s figures). Unlike llama.cpp, the whole process group is
killed, so a shell's background children do not keep running (or keep the pipe open); with
``reap`` (Linux), the program runs under a ``reaper`` that kills everything it started, in
another session too, when it ends, at its deadline, and when the agent stops or dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import node_agent
from node_agent.child.pdeathsig import make_preexec, pdeathsig_supported

OnChunk = Callable[[bytes], Awaitable[bool]]
"""Called with each piece of output kept; False stops the program (the client left)."""

TRUNCATED = b"\n[output truncated]"
READ_SIZE = 4096
_DRAIN_AFTER_KILL = 2.0  # seconds: what a killed group may still write before we stop reading
_REAPER_GRACE = 5.0  # seconds for the reaper's sweep after SIGTERM, then its group is killed
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(node_agent.__file__)))
# -I -S: nothing from the environment or site-packages; only this package's folder on the path.
_REAPER = (
    "import sys; sys.path.insert(0, sys.argv[1]); from node_agent.tools.reaper import main; main()"
)


@dataclass(frozen=True, slots=True)
class ExecResult:
    output: bytes
    exit_code: int = -1
    timed_out: bool = False


async def run_program(
    args: Sequence[str],
    max_output: int,
    seconds: float,
    *,
    on_chunk: OnChunk | None = None,
    combine_stderr: bool = True,
    cwd: str | None = None,
    stdin_data: bytes | None = None,
    reap: bool = False,
) -> ExecResult:
    status_read = status_write = -1
    reaped = reap and pdeathsig_supported()  # Linux: the reaper's prctl calls are there too
    if reaped:
        status_read, status_write = os.pipe()
        args = [sys.executable, "-I", "-S", "-c", _REAPER, _PACKAGE_PARENT, str(status_write),
                cwd or "", *args]  # fmt: skip
        cwd = None  # the reaper starts the program there (a missing one: failed to spawn)
    spawning = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if combine_stderr else asyncio.subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,  # its own group, killed as one
            pass_fds=(status_write,) if reaped else (),
            # the reaper sweeps what is below it when the agent dies
            preexec_fn=make_preexec(signal.SIGTERM) if reaped else None,
        )
    )
    if reaped:  # the fork is over: the reaper has its copy
        spawning.add_done_callback(lambda _: os.close(status_write))
    try:
        # Shielded: cancelled while asyncio still connects the pipes, asyncio would SIGKILL
        # the process alone, so a reaper died before its sweep and what the program had
        # started lived on (a CI run: an agent stopped just as a tool call began).
        proc = await asyncio.shield(spawning)
    except asyncio.CancelledError:
        try:
            with contextlib.suppress(OSError, ValueError):  # never started: nothing to end
                await asyncio.shield(_end_spawned(spawning, reaped))
        finally:
            if reaped:
                os.close(status_read)
        raise
    except (OSError, ValueError):
        if reaped:
            os.close(status_read)
        return ExecResult(b"failed to spawn process")
    running = _Running(proc, reaped)
    try:
        output, truncated, timed_out = await _run(
            running, max_output, seconds, on_chunk, stdin_data
        )
    finally:
        spawned = _read_status(status_read) if reaped else True
    if not spawned:
        return ExecResult(b"failed to spawn process")
    code = proc.returncode
    exit_code = code if code is not None and code >= 0 else 1
    return ExecResult(output + (TRUNCATED if truncated else b""), exit_code, timed_out)


async def _end_spawned(spawning: asyncio.Future[asyncio.subprocess.Process], reaped: bool) -> None:
    """End a program whose caller was cancelled while it started, as a started one ends."""
    running = _Running(await spawning, reaped)
    running.kill()
    await running.wait_killed()


@dataclass(frozen=True, slots=True)
class _Running:
    proc: asyncio.subprocess.Process
    reaped: bool  # started under the reaper

    def kill(self) -> None:
        """The reaper gets SIGTERM (it kills everything below it, then exits); a program
        without one, SIGKILL to its group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.reaped:
                os.kill(self.proc.pid, signal.SIGTERM)
            else:
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def wait_killed(self) -> None:
        if self.reaped:
            try:
                await asyncio.wait_for(self.proc.wait(), _REAPER_GRACE)
                return
            except TimeoutError:  # the sweep never ended: the group at least goes
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()


async def _run(
    running: _Running,
    max_output: int,
    seconds: float,
    on_chunk: OnChunk | None,
    stdin_data: bytes | None,
) -> tuple[bytes, bool, bool]:
    proc = running.proc
    feeding = asyncio.ensure_future(_feed(proc, stdin_data))
    deadline = time.monotonic() + seconds
    try:
        output, truncated, timed_out = await _read(running, max_output, deadline, on_chunk)
        try:  # a program that closed its output (``> /tmp/log``) still has its time only
            await asyncio.wait_for(proc.wait(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            timed_out = True
            running.kill()
            await running.wait_killed()
    finally:
        feeding.cancel()
        if proc.returncode is None:  # cancelled (the client or the agent went away)
            running.kill()
            with contextlib.suppress(ProcessLookupError):
                await asyncio.shield(running.wait_killed())
    return output, truncated, timed_out


def _read_status(fd: int) -> bool:
    """Whether the reaper started the program (it wrote ``spawn`` if not); read once it
    ended, so the pipe holds all it will ever hold."""
    try:
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError):
            return os.read(fd, 16) != b"spawn"
        return True
    finally:
        os.close(fd)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(OSError):  # a program that does not read its stdin
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()


async def _read(
    running: _Running, max_output: int, deadline: float, on_chunk: OnChunk | None
) -> tuple[bytes, bool, bool]:
    proc = running.proc
    assert proc.stdout is not None
    output = bytearray()
    truncated = timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            running.kill()
            deadline = time.monotonic() + _DRAIN_AFTER_KILL
            continue
        if left <= 0:
            break
        try:
            chunk = await asyncio.wait_for(proc.stdout.read(READ_SIZE), left)
        except TimeoutError:
            continue
        if not chunk:
            break
        if truncated:
            continue
        room = max_output - len(output)
        kept = chunk[: max(room, 0)]
        truncated = len(chunk) > room
        output += kept
        if on_chunk is not None and kept and not await on_chunk(kept) and not truncated:
            running.kill()
            break
    return bytes(output), truncated, timed_out
