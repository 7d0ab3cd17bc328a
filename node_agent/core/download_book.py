"""The downloads under way, and what may start beside them: pure decisions, no I/O.

A download (``POST /models``, or a preset's file before its load) is kept apart from the
scheduler on purpose: it holds no instance slot and no device memory (issue 14). What this
book decides:

* a second download of a name already on its way is refused, like llama.cpp ("already
  exists"); so is one whose files (blobs) overlap a download on its way, which llama.cpp lets
  both write into the same partial file;
* which progress reports reach ``/models/sse``: at most one per :data:`REPORT_SECONDS` per
  download (llama.cpp's 100 ms throttle), and always a file's first and last;
* how many requests wait for a download, against ``--max-queue``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

REPORT_SECONDS = 0.1


class Refusal(enum.Enum):
    EXISTS = "exists"
    SHARES = "shares"


@dataclass
class _Entry:
    files: frozenset[str]
    progress: dict[str, dict[str, int]] = field(default_factory=dict)
    reported_at: float | None = None
    waiters: int = 0


@dataclass(frozen=True, slots=True)
class DownloadStatistics:
    downloads: int
    waiters: int


class DownloadBook:
    """Downloads by model name, with the files each writes."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def check(self, name: str, files: frozenset[str]) -> tuple[Refusal, str] | None:
        """Why ``name`` (writing ``files``) may not start now, and the download in the way."""
        if name in self._entries:
            return Refusal.EXISTS, name
        for other, entry in sorted(self._entries.items()):
            if entry.files & files:
                return Refusal.SHARES, other
        return None

    def begin(self, name: str, files: frozenset[str]) -> tuple[Refusal, str] | None:
        """Record ``name``'s download unless :meth:`check` refuses it (then the refusal)."""
        refusal = self.check(name, files)
        if refusal is None:
            self._entries[name] = _Entry(files)
        return refusal

    def active(self, name: str) -> bool:
        return name in self._entries

    def files(self, name: str) -> frozenset[str]:
        entry = self._entries.get(name)
        return entry.files if entry is not None else frozenset()

    def names(self) -> list[str]:
        return sorted(self._entries)

    def progress(
        self, name: str, url: str, done: int, total: int | None, now: float
    ) -> dict[str, dict[str, int]] | None:
        """Record a file's progress; the whole download's progress when it is due a report."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        first = url not in entry.progress
        entry.progress[url] = {"done": done, "total": total or 0}
        last = total is not None and done >= total
        due = entry.reported_at is None or now - entry.reported_at >= REPORT_SECONDS
        if not (first or last or due):
            return None
        entry.reported_at = now
        return {u: dict(p) for u, p in entry.progress.items()}

    def join(self, name: str, max_queue: int | None) -> bool:
        """A request waits for ``name``'s download; False when ``max_queue`` already wait."""
        entry = self._entries[name]
        if max_queue is not None and entry.waiters >= max_queue:
            return False
        entry.waiters += 1
        return True

    def leave(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is not None and entry.waiters > 0:
            entry.waiters -= 1

    def waiters(self, name: str) -> int:
        entry = self._entries.get(name)
        return entry.waiters if entry is not None else 0

    def end(self, name: str) -> None:
        self._entries.pop(name, None)

    def statistics(self) -> DownloadStatistics:
        return DownloadStatistics(
            downloads=len(self._entries),
            waiters=sum(e.waiters for e in self._entries.values()),
        )
