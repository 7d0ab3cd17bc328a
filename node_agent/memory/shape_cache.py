"""GGUF shapes by file version: each header is read once, within a time bound, wherever the
caller runs it (the agent: a worker thread), and kept in a bounded cache.

``GET /models`` shows every model's memory figures and admission estimates before each load;
both once read the header on the event loop, for every request, and a crafted header froze the
agent for minutes (issue 26, row 6). Here the reading (:func:`read_file`) is a plain function
that returns what it found, an unreadable header included, so one owner (the agent's loop)
keeps the results (:class:`ShapeCache`) and a bad file is read once per version, not per
request.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:  # the reader imports gguf, hence numpy: lazily, in read_file (start-up time)
    from node_agent.memory.shape import ModelShape, VisionShape

Kind = Literal["model", "vision"]

# The header walk's bound. A real model's header (a 256k-token vocabulary, a few thousand
# tensors) takes tens of milliseconds; one that takes seconds is crafted.
HEADER_TIME_LIMIT = 5.0
# File versions kept: the node's models and their projectors, with room for old versions (more
# when a listing asks for more at once: MemoryWatch.prepare_off_loop).
SHAPES_KEPT = 512


class FileKey(NamedTuple):
    """One version of one file, read as a model or as a projector. A named tuple: GET /models
    makes one per model file (its estimate's key), and a frozen dataclass took twice as long
    to make."""

    kind: Kind
    path: str
    mtime_ns: int
    size: int


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why a file's header gives no shape (kept as text: a cached exception would grow its
    traceback each time it is raised again)."""

    reason: str


def file_key(path: str, kind: Kind) -> FileKey:
    """The key of ``path`` as it is now (one stat); raises OSError when it is not there."""
    st = os.stat(path)
    return FileKey(kind, path, st.st_mtime_ns, st.st_size)


def read_file(
    key: FileKey, time_limit: float = HEADER_TIME_LIMIT
) -> ModelShape | VisionShape | Unreadable:
    """Read ``key``'s header into its shape, or why it cannot be (never raises for a bad file:
    the caller runs it in a worker and keeps the result either way)."""
    from node_agent.memory.gguf_header import GgufError, read_header
    from node_agent.memory.shape import shape_from_header, vision_from_header

    try:
        header = read_header(Path(key.path), time_limit=time_limit)
        if key.kind == "vision":
            return vision_from_header(header, key.path)
        return shape_from_header(header, key.path)
    except (GgufError, OSError, ValueError, ArithmeticError) as exc:
        return Unreadable(str(exc))


class ShapeCache:
    """The last :data:`SHAPES_KEPT` file versions' shapes (or why each is unreadable), least
    recently used out first. Not thread-safe: one owner reads and fills it."""

    def __init__(self, limit: int = SHAPES_KEPT) -> None:
        self._limit = limit
        self._entries: OrderedDict[FileKey, ModelShape | VisionShape | Unreadable] = OrderedDict()

    def get(self, key: FileKey) -> ModelShape | VisionShape | Unreadable | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: FileKey, value: ModelShape | VisionShape | Unreadable) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def hold_at_least(self, count: int) -> None:
        """Keep ``count`` versions from now on, if that is more than the bound so far."""
        self._limit = max(self._limit, count)

    def __len__(self) -> int:
        return len(self._entries)
