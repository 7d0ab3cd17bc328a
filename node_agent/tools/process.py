"""Run one program for a tool: bounded output, bounded time, never blocking the event loop.

llama.cpp's ``run_subprocess``: the argv is run as given (no shell unless the argv names one),
stdin gets ``stdin_data`` and is closed, output is read as it comes and kept up to
``max_output`` bytes (then ``[output truncated]``; the rest is drained so the program never
blocks on a full pipe). At the deadline the program is killed and ``timed_out`` is set; a
program killed by a signal reports exit code 1, one that cannot be started -1 with "failed to
spawn process" (``subprocess.h``'s figures). Unlike llama.cpp, the whole process group is
killed, so a shell's background children do not keep running (or keep the pipe open).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

OnChunk = Callable[[bytes], Awaitable[bool]]
"""Called with each piece of output kept; False stops the program (the client left)."""

TRUNCATED = b"\n[output truncated]"
READ_SIZE = 4096
_DRAIN_AFTER_KILL = 2.0  # seconds: what a killed group may still write before we stop reading


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
) -> ExecResult:
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if combine_stderr else asyncio.subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,  # its own group, killed as one
        )
    except (OSError, ValueError):
        return ExecResult(b"failed to spawn process")
    feeding = asyncio.ensure_future(_feed(proc, stdin_data))
    deadline = time.monotonic() + seconds
    try:
        output, truncated, timed_out = await _read(proc, max_output, deadline, on_chunk)
        try:  # a program that closed its output (``> /tmp/log``) still has its time only
            await asyncio.wait_for(proc.wait(), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            timed_out = True
            _kill(proc)
            await proc.wait()
    finally:
        feeding.cancel()
        if proc.returncode is None:  # cancelled (the client or the agent went away)
            _kill(proc)
            with contextlib.suppress(ProcessLookupError):
                await asyncio.shield(proc.wait())
    code = proc.returncode
    exit_code = code if code is not None and code >= 0 else 1
    return ExecResult(output + (TRUNCATED if truncated else b""), exit_code, timed_out)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(OSError):  # a program that does not read its stdin
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()


async def _read(
    proc: asyncio.subprocess.Process, max_output: int, deadline: float, on_chunk: OnChunk | None
) -> tuple[bytes, bool, bool]:
    assert proc.stdout is not None
    output = bytearray()
    truncated = timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and not timed_out:
            timed_out = True
            _kill(proc)
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
            _kill(proc)
            break
    return bytes(output), truncated, timed_out


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
