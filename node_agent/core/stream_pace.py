"""When a streamed answer's next read waits, so that a fast stream's events come in fewer reads.

Each read of a child's stream costs the agent a wake-up of its loop: ~100 µs of CPU per
llama-server event on a busy 2-core machine (1,400 tokens/s, CPU time from schedstat), most of
it the wake-up itself, not the bytes; the router's C++ paid ~30 µs. When events come faster
than the window, the next read waits (*gathers*) until the window has passed: the events
written meanwhile come in one read. Bench S2 with a 10 ms window, five pairs of runs: the
agent's CPU 0.58-0.76 s -> 0.27-0.49 s (the router's 0.30-0.37 s), tokens/s 0.80-0.90x ->
1.03-1.10x the router's, since the child's two compute threads lose less of the cores to the
agent (and to the client, which wakes less often too).

What a gathering costs is latency, about one window per event at most (more when a busy loop
comes late to a release), and only for a stream of :data:`FAST` events or more a window (over
200 tokens/s at 10 ms); a slower stream is read per event as before.
The first reads pass at once (time to the first token is not touched). The child's closing
after its last event wakes the reader whatever it waits for (``api/wire.py``), but those last
writes may wait in the child's socket for an acknowledgement (see :class:`StreamPace`): the end
comes within a window too (from the child's close to the client's last byte: 0.4-6.5 ms with
a 10 ms window, 0.1-7.6 ms without, four streams each).
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Final

# Only Linux wakes a reader when its socket's mark is lowered (the end of a gathering: see
# api/wire.py); elsewhere a stream is read per event.
SUPPORTED: Final = sys.platform == "linux"
DEFAULT_WINDOW: Final = 0.010 if SUPPORTED else 0.0
# llama-server's first read of a chat stream holds the role's event and the first token
# (measured with b11434); a second read passes at once too, for a first token written apart.
IMMEDIATE_READS: Final = 2
# A read this soon after a gathering ended is the one that ended it.
AT_RELEASE: Final = 0.001
# A gathering costs two wake-ups (its end, and the read after: see StreamPace), so it saves
# some only for a stream of more pieces (the child's writes, one event each) than that in a
# window. Bench S8's 64 streams, ~175 tokens/s each (under 2 a window), cost 10-15% more CPU
# per chunk when gathered from 2 pieces a window.
FAST: Final = 3


class StreamPace:
    """Whether the read after this one gathers for ``window`` seconds (0: never).

    A read starts a gathering when the reads of the last window, it included, brought
    :data:`FAST` pieces or more, unless it is the read that ends a gathering: llama-server's
    socket waits for an acknowledgement before it sends a small write (Nagle's algorithm, on
    in cpp-httplib), and the reader's socket acknowledges only when read. So the events written
    while a gathering holds the last one unread reach the reader's socket just after that read:
    a gathering started at once would leave them there for a second window (measured: 9-15 ms
    median delay, 21 ms at most, with a 10 ms window). The read after it, of those events (or
    of the next, from a child that sends at once), starts the next gathering."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._reads = 0
        # The last FAST reads (when, pieces): each brings one piece or more, so the reads of
        # a window bring FAST pieces exactly when these do.
        self._recent: deque[tuple[float, int]] = deque(maxlen=FAST)
        self._released: float | None = None  # a gathering ended then, and no read came since
        self._gathering = False

    @property
    def window(self) -> float:
        return self._window

    def read(self, now: float, pieces: int = 1) -> bool:
        """A read of ``pieces`` pieces was handed on at ``now``. True: gather before the next
        one, until :meth:`released` (a read during a gathering, of a full buffer, starts
        none)."""
        self._reads += 1
        self._recent.append((now, pieces))
        at_release = self._released is not None and now - self._released < AT_RELEASE
        self._released = None
        if self._gathering or self._reads < IMMEDIATE_READS or at_release or not self._fast(now):
            return False
        self._gathering = True
        return True

    def released(self, now: float) -> None:
        """The window of a gathering ended at ``now``: what came meanwhile is read next."""
        self._gathering = False
        self._released = now

    def _fast(self, now: float) -> bool:
        recent = sum(n for when, n in self._recent if now - when < self._window)
        return recent >= FAST
