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


class EventFrames:
    """Splits a byte stream of server-sent events at its last event boundary."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What may be passed on now: everything up to the last blank line (``\\n\\n`` or
        ``\\r\\n\\r\\n``); the rest is held for the next chunk."""
        data = self._held + chunk if self._held else chunk
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
        end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if end == 0 and len(data) > MAX_HELD:
            end = len(data)
        self._held = data[end:]
        return data[:end]

    def rest(self) -> bytes:
        """At the stream's own end: what is held (a last event without its blank line)."""
        rest, self._held = self._held, b""
        return rest
