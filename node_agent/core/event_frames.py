"""Server-sent events passed on whole.

A streamed answer is forwarded as it comes, but a child (or a peer) that dies mid-write can
leave half an event behind, and the proxy's error event appended to it made one malformed
line (``"created":data: {"error": …}``: found when a peer was killed mid-stream under load).
So the bytes after the last event boundary are held back until the event ends: a stream cut
mid-event ends on a boundary, and the error event that follows is an event of its own. A
llama-server writes whole events per write, so in practice nothing is held.
"""

from __future__ import annotations

from typing import Final

# An "event" this long without a boundary is passed on as it is: never buffered without bound.
MAX_HELD: Final = 1 << 20
_BOUNDARIES: Final = (b"\n\n", b"\r\n\r\n")
_OVERLAP: Final = 3  # a boundary split across two chunks has at most 3 bytes in the first


def _after_last_boundary(data: bytes) -> int:
    """The index just past ``data``'s last event boundary, 0 when it has none."""
    ends = (data.rfind(b) + len(b) for b in _BOUNDARIES if b in data)
    return max(ends, default=0)


class EventFrames:
    """Splits a byte stream of server-sent events at its last event boundary.

    Each chunk is searched once (with the few held bytes a boundary may straddle) and held
    pieces are joined only when passed on: a child or peer that sends a long run without a
    boundary in tiny pieces costs linear work, not a copy and a search of all it sent so
    far per piece."""

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._size = 0
        self._edge = b""  # the held bytes' last few, where a boundary may begin

    def feed(self, chunk: bytes) -> bytes:
        """What may be passed on now: everything up to the last blank line (``\\n\\n`` or
        ``\\r\\n\\r\\n``); the rest is held for the next chunk."""
        if not self._held:
            if chunk.endswith(b"\n\n"):  # a whole event or more: nearly always
                return chunk
            end = _after_last_boundary(chunk)
            if end == len(chunk):
                return chunk
            self._hold([chunk[end:]])
            return chunk[:end]
        edge = self._edge
        end = _after_last_boundary(edge + chunk) - len(edge)
        if end > 0:  # the boundary ends in this chunk
            out = b"".join(self._held) + chunk[:end]
            self._hold([chunk[end:]] if end < len(chunk) else [])
            return out
        self._held.append(chunk)
        self._size += len(chunk)
        self._edge = (edge + chunk)[-_OVERLAP:]
        if self._size > MAX_HELD:
            return self.rest()
        return b""

    def rest(self) -> bytes:
        """At the stream's own end: what is held (a last event without its blank line)."""
        rest = b"".join(self._held)
        self._hold([])
        return rest

    def _hold(self, pieces: list[bytes]) -> None:
        self._held = pieces
        self._size = sum(map(len, pieces))
        self._edge = pieces[-1][-_OVERLAP:] if pieces else b""
