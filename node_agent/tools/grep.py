"""The process that runs one ``grep_search``'s regular expression (``grep_worker``), and its
bounds.

A thread does not protect the event loop from a client's pattern: ``re`` holds the GIL while it
backtracks, and no thread can be stopped (issue 26, row 1). The worker is a process of its own:
it compiles and matches under its own GIL and a memory limit, and it is killed when the call's
time is up, when the call ends (cancelled too), and when the agent dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import node_agent
from node_agent.child.pdeathsig import make_preexec

GREP_TIMEOUT = 10.0  # seconds for the pattern's compilation, then again for all the matching
GREP_MAX_OUTPUT = 1024 * 1024  # characters of matched lines in one answer
GREP_WORKERS = 4  # processes at once, as many as the tools' threads; a call waits for one
# A reply holds at most GREP_MAX_OUTPUT characters, each at most 6 in JSON (``\uXXXX``).
_REPLY_LIMIT = 6 * GREP_MAX_OUTPUT + 64 * 1024
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(node_agent.__file__)))
# -I -S: nothing from the environment or site-packages; only this package's folder on the path.
_WORKER = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from node_agent.tools.grep_worker import main; main()"
)


class GrepError(Exception):
    """What the model reads instead of matches (the message is the tool's error)."""


def timed_out(searched: int | None = None, files: int = 0) -> GrepError:
    """``searched`` of ``files`` were done in time (None: the pattern's compilation was not)."""
    where = "compiling the pattern" if searched is None else f"{searched} of {files} files searched"
    return GrepError(
        f"grep_search timed out after {GREP_TIMEOUT:g} s ({where}): simplify the pattern "
        "(nested quantifiers such as (a+)+ backtrack) or narrow the path/include"
    )


@dataclass(frozen=True, slots=True)
class FileMatches:
    lines: list[str]
    matches: int
    full: bool  # the match limit was reached
    truncated: bool  # the output was cut at GREP_MAX_OUTPUT


class Matcher:
    """One call's worker; see :func:`matcher`."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def _exchange(self, message: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.write(payload)  # a file of up to 64 MiB: not copied into one more
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        except (ConnectionError, ValueError):  # it died (out of memory), or said too much
            line = b""
        if not line:
            raise GrepError("grep_search failed: the matching process ended (out of memory?)")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def compile(self, pattern: str, ignore_case: bool, numbered: bool, context: int) -> None:
        """Raises GrepError for an invalid pattern or one that takes too long to compile."""
        spec = {
            "pattern": pattern,
            "ignore_case": ignore_case,
            "numbered": numbered,
            "context": context,
        }
        try:
            async with asyncio.timeout(GREP_TIMEOUT):
                reply = await self._exchange(spec)
        except TimeoutError:
            raise timed_out() from None
        if "error" in reply:
            raise GrepError(str(reply["error"]))

    async def grep(self, content: bytes, shown: str, room: int, max_output: int) -> FileMatches:
        """One file's matches. The caller bounds the time (``asyncio.timeout``)."""
        header = {"shown": shown, "room": room, "max_output": max_output, "size": len(content)}
        reply = await self._exchange(header, content)
        return FileMatches(
            [str(x) for x in reply["lines"]],
            int(reply["matches"]),
            bool(reply["full"]),
            bool(reply["truncated"]),
        )


# Each worker may take a core and a GiB: concurrent calls must not multiply them. One
# semaphore per event loop (one in the agent; tests run several loops).
_workers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def matcher() -> AsyncIterator[Matcher]:
    """A worker for one call, killed when the block ends however it ends."""
    loop = asyncio.get_running_loop()
    slots = _workers.setdefault(loop, asyncio.Semaphore(GREP_WORKERS))
    async with slots, _started() as worker:
        yield worker


@contextlib.asynccontextmanager
async def _started() -> AsyncIterator[Matcher]:
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            "-c",
            _WORKER,
            _PACKAGE_PARENT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=_REPLY_LIMIT,
            start_new_session=True,  # a terminal's Ctrl-C is the agent's to handle
            preexec_fn=make_preexec(),
        )
    except OSError as exc:
        raise GrepError(f"grep_search failed: cannot start the matching process: {exc}") from None
    try:
        yield Matcher(proc)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
