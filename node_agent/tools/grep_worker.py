"""``grep_search``'s matching, in a process of its own (``node_agent.tools.grep`` starts it).

A client's regular expression can backtrack for ages (``(a+)+$b`` on a line of 40 ``a``), and
Python's ``re`` holds the GIL all the while: in a thread of the agent it stopped the event
loop for good (issue 26, row 1). Here it holds only this process's GIL, under a memory limit,
and the agent kills the process at the call's time bound.

The standard library only: the process runs isolated (``python -I -S``) and imports nothing
of the agent's but this module.

Protocol, stdin to stdout, one JSON line each way: ``{"pattern", "ignore_case", "numbered",
"context"}`` is answered ``{"ok": true}`` or ``{"error": "invalid regex: …"}``; then, per file,
``{"shown", "room", "max_output", "size"}`` followed by ``size`` bytes of content is answered
``{"lines", "matches", "full", "truncated"}`` (``grep_lines``'s result).
"""

from __future__ import annotations

import json
import re
import resource
import sys
from typing import Any, BinaryIO

MEMORY_LIMIT = 1024 * 1024 * 1024  # bytes of address space: a file's lines, not the machine


def split_lines(content: bytes) -> list[bytes]:
    """``std::getline``'s lines: split at ``\\n``, no empty line after a final one."""
    lines = content.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


def as_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def grep_lines(
    regex: re.Pattern[str],
    content: bytes,
    shown: str,
    numbered: bool,
    context: int,
    room: int,
    max_output: int,
) -> tuple[list[str], int, bool, bool]:
    """One file's output lines (llama.cpp's), its matches (at most ``room``), whether the
    match limit was hit, and whether the output was cut at ``max_output`` characters."""
    lines = split_lines(content)
    out: list[str] = []
    size = 0
    matches = 0
    for i, line in enumerate(lines):
        if matches >= room:
            return out, matches, True, False
        if not regex.search(as_text(line)):
            continue
        for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
            mark = ":" if j == i else "-"
            number = f"{j + 1}{mark}" if numbered else ""
            piece = f"{shown}{mark}{number}{as_text(lines[j])}\n"
            size += len(piece)
            if size > max_output:  # a huge context on a huge file: the answer stays bounded
                return out, matches, False, True
            out.append(piece)
        if context > 0:
            out.append("--\n")
            size += 3
        matches += 1
    return out, matches, False, False


def _answer(stdout: BinaryIO, message: dict[str, Any]) -> None:
    stdout.write(json.dumps(message).encode() + b"\n")
    stdout.flush()


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    spec = json.loads(stdin.readline())
    try:
        regex = re.compile(spec["pattern"], re.IGNORECASE if spec["ignore_case"] else 0)
    except (re.error, RecursionError, OverflowError) as exc:
        # Python's message, where llama.cpp has ECMAScript's (the common syntax reads the same)
        _answer(stdout, {"error": f"invalid regex: {exc}"})
        return
    _answer(stdout, {"ok": True})
    while header := stdin.readline():
        job = json.loads(header)
        content = stdin.read(job["size"])
        found, matches, full, truncated = grep_lines(
            regex,
            content,
            job["shown"],
            spec["numbered"],
            spec["context"],
            job["room"],
            job["max_output"],
        )
        del content
        _answer(stdout, {"lines": found, "matches": matches, "full": full, "truncated": truncated})
