"""A ring buffer of a child's log lines, readable as a snapshot or followed as a stream.

llama-server's stderr goes here, never into the agent's log (SPEC, "Children"). Lines carry a
sequence number, so a follower that was away resumes where it left off; one that falls more
than ``capacity`` lines behind skips to the oldest line still held (it is told how many it
missed by the gap in :meth:`LogRing.lines_since`). Single event loop, no locks: only the owner
of a child appends.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Final

from node_agent.redact import kept_for_redaction, redact_clipped

# The most of one line a ring keeps (llama.cpp's own lines are a few hundred characters).
MAX_LINE_CHARS: Final = 4096
# llama.cpp's log lines look like "0.00.002.452 E srv  start: …": the level letter after the
# timestamp. Other binaries: the usual words.
_ERROR_LINE: Final = re.compile(r"^\S+ E |error|failed|couldn't|cannot|unable", re.IGNORECASE)
# Error lines that only echo a failure logged just before them. llama.cpp logs the cause
# first, then every caller up the stack says it failed too, ending with "exiting due to model
# loading error": a corrupt GGUF's last error line names no cause. Measured with the pinned
# binary: "error loading model: … data is not within the file bounds" (truncated file) and
# "gguf_init_from_reader: invalid magic characters" (not a GGUF) come before these echoes.
_ECHO_LINE: Final = re.compile(
    r"exiting due to"
    r"|encountered an error while trying to fit params"
    r"|failed to load model(,? (from )?'?[^ ']*'?)?\s*$",
    re.IGNORECASE,
)
# Lines that say nothing about a failure, printed at every start: when a child dies without an
# error line (killed, SIGILL), its last line is often one of these, and a reason that ended in
# "last log line: AMX is not ready to be used!" sent users after the wrong cause (issue 29).
# ggml's AMX probe prints its line with a bare fprintf, at start, on every AMX CPU.
_BANNER_LINE: Final = re.compile(
    r"^AMX is not ready to be used!"
    r"|security: no API key is set"
    r"|common_params_print_info: verbosity"
    r"|load_backend: loaded"
    r"|cleaning up before exit",
)


def failure_line(lines: list[str], *, skip_prefix: str | None = None) -> str | None:
    """The line most likely to say why a child failed.

    Its last error line that is not a mere echo of an earlier one (see ``_ECHO_LINE``), else
    its last error line, else its last line that is not a banner (``_BANNER_LINE``).
    """
    kept = [line.strip() for line in lines if not (skip_prefix and line.startswith(skip_prefix))]
    kept = [line for line in kept if line and not _BANNER_LINE.search(line)]
    errors = [line for line in kept if _ERROR_LINE.search(line)]
    for line in reversed(errors):
        if not _ECHO_LINE.search(line):
            return line
    if errors:
        return errors[-1]
    return kept[-1] if kept else None


@dataclass(frozen=True)
class LogStatistics:
    capacity: int
    held: int
    appended: int  # every line ever appended; appended - held were dropped
    closed: bool


class LogRing:
    """The last ``capacity`` lines of a child's output."""

    def __init__(self, capacity: int = 1000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        # Each line as written (cut to what its redaction reads), its whole length, and its
        # masked form once someone read it: lines are masked when first read (GET
        # /models/logs, the error line in GET /models, the operator's lastError), not as
        # written, ~9 per request (36 µs each).
        self._lines: deque[_Held] = deque(maxlen=capacity)
        self._next_seq = 0  # sequence number of the next line appended
        self._closed = False
        # Replaced on every append: followers wait on the event current when they looked.
        self._changed = asyncio.Event()

    @property
    def capacity(self) -> int:
        assert self._lines.maxlen is not None
        return self._lines.maxlen

    @property
    def closed(self) -> bool:
        return self._closed

    def append(self, line: str) -> None:
        if self._closed:
            return
        # Cut now: the memory and the later work per line are bounded, whatever a child
        # writes (40 MB of stderr in 64 KB lines cost the loop 0.4 s a second, issue 26
        # row 16). A child prints its command line and URLs: every reader gets them masked.
        self._lines.append(_Held(kept_for_redaction(line, MAX_LINE_CHARS), len(line)))
        self._next_seq += 1
        self._wake()

    def close(self) -> None:
        """No more lines will come: followers end once they have read what is held."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def snapshot(self) -> list[str]:
        return [_shown(entry) for entry in self._lines]

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        return [_shown(entry) for entry in list(self._lines)[-n:]]

    def lines_since(self, seq: int) -> tuple[int, list[str]]:
        """Lines numbered ``seq`` and later still held, and the sequence number to ask next."""
        return self._next_seq, [_shown(entry) for entry in self._since(seq)]

    def failure_since(self, seq: int) -> str | None:
        """:func:`failure_line` of the lines numbered ``seq`` and later, masked: chosen from
        the lines as written, so that only the one chosen is masked."""
        line = failure_line([held.kept for held in self._since(seq)])
        return None if line is None else redact_clipped(line, MAX_LINE_CHARS)

    def _since(self, seq: int) -> list[_Held]:
        oldest = self._next_seq - len(self._lines)
        return list(self._lines)[max(seq, oldest) - oldest :]

    async def follow(self, backlog: int = 0) -> AsyncGenerator[str, None]:
        """Yield the last ``backlog`` lines, then each new line as it comes, until closed."""
        seq = self._next_seq - min(max(backlog, 0), len(self._lines))
        while True:
            changed = self._changed
            seq, lines = self.lines_since(seq)
            for line in lines:
                yield line
            if self._closed:
                return
            if seq == self._next_seq:
                await changed.wait()

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            capacity=self.capacity,
            held=len(self._lines),
            appended=self._next_seq,
            closed=self._closed,
        )


@dataclass(slots=True)
class _Held:
    kept: str  # as written, cut to what its redaction reads
    length: int  # the whole line's
    shown: str | None = None  # masked and cut, once someone read it


def _shown(held: _Held) -> str:
    """A held line as readers see it: masked and cut (``redact_clipped``), once."""
    if held.shown is None:
        held.shown = redact_clipped(held.kept, MAX_LINE_CHARS, length=held.length)
    return held.shown
