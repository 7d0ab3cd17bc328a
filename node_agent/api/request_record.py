"""What the metrics learn about one proxied request while the handlers serve it.

The metrics middleware puts an :class:`Exchange` on every request; the proxy handler tells it
the model (before it queues), when its lease was granted, and hands it the child's response
bytes as they pass. The middleware reads it back when the response has ended. It imports
nothing of the API (a leaf of its import layers), so the routes and the proxy all can.

Token figures come from the child's ``usage``/``timings`` objects: for a plain JSON body the
whole body, for a stream only the last server-sent event that carries them. The stream is
never held back or parsed as it passes (issue 30): :class:`StreamScanner` keeps a bounded
tail of it and reads the last report there once, when the metrics ask.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from node_agent.core.scheduler_events import ChildFault

# A usage event is a few hundred bytes; an event bigger than this is content. A stream's last
# MAX_TAIL_BYTES are kept: room for the last report and the events after it.
MAX_EVENT_BYTES = 64 * 1024
MAX_TAIL_BYTES = 2 * MAX_EVENT_BYTES
_USAGE, _TIMINGS = b'"usage"', b'"timings"'
_COUNTS = (b'"tokens_evaluated"', b'"tokens_predicted"')  # /completion's own figures
_MARKERS = (_USAGE, _TIMINGS, *_COUNTS)
_LONGEST_MARKER = max(len(m) for m in _MARKERS)
# What a piece of a stream is searched for: the markers, the two counts by their prefix (three
# searches in C, no generator: this runs for every streamed event, issue 30).
_USAGE_KEYS = (_USAGE, _TIMINGS, b'"tokens_')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Usage:
    """Tokens of one response, as the child reported them (None: not reported)."""

    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    prompt_seconds: float | None = None
    generation_seconds: float | None = None


def _value_after(blob: bytes, key: bytes) -> Any:
    """The JSON value after the last ``"key":`` in ``blob`` (None when absent or broken).

    Decoding only that value keeps the cost flat for big bodies (embeddings). A key inside a
    string would be escaped (``\\"usage\\"``), so the last bare one is the top-level field.
    """
    at = blob.rfind(key)
    if at < 0:
        return None
    text = blob[at + len(key) : at + len(key) + 4096].decode(errors="replace").lstrip()
    if not text.startswith(":"):
        return None
    try:
        value, _ = _DECODER.raw_decode(text[1:].lstrip())
    except ValueError:
        return None
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(ms: Any) -> float | None:
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
        return float(ms) / 1000.0
    return None


def usage_in(blob: bytes) -> Usage | None:
    """The token figures in one response object of llama-server, or None when it has none.

    ``usage`` (OpenAI: prompt/completion_tokens; Anthropic and Responses: input/output_tokens)
    counts the whole prompt, cached tokens included, so it wins over ``timings.prompt_n``,
    which counts only the tokens evaluated this time. ``/completion`` reports
    ``tokens_evaluated``/``tokens_predicted`` beside its ``timings``.
    """
    if not any(marker in blob for marker in _MARKERS):
        return None
    usage = _value_after(blob, _USAGE)
    usage = usage if isinstance(usage, dict) else {}
    timings = _value_after(blob, _TIMINGS)
    timings = timings if isinstance(timings, dict) else {}
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
    generated = _int(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt is None:
        prompt = _int(_value_after(blob, _COUNTS[0]))
    if generated is None:
        generated = _int(_value_after(blob, _COUNTS[1]))
    if prompt is None:
        prompt = _int(timings.get("prompt_n"))
    if generated is None:
        generated = _int(timings.get("predicted_n"))
    if prompt is None and generated is None:
        return None
    return Usage(
        prompt, generated, _seconds(timings.get("prompt_ms")), _seconds(timings.get("predicted_ms"))
    )


class StreamScanner:
    """The last usage report in a stream of server-sent events fed piece by piece.

    Each piece is kept (the last :data:`MAX_TAIL_BYTES` of them) and only looked at for a
    report's key (a search in C); the events are split and read once, from the end, when
    :attr:`usage` is asked for. A report about to leave the tail with no later one in it is
    read then (a report followed by that much output: rare), so the last one is never lost.
    """

    def __init__(self) -> None:
        self._tail: collections.deque[tuple[bytes, bool]] = collections.deque()
        self._size = 0
        self._marked = 0  # pieces in the tail that hold (or end) a report's key
        self._edge = b""  # the last bytes fed: a key split between two pieces
        self._usage: Usage | None = None  # as of the last read
        self._read = True  # nothing fed since the tail was last read

    def feed(self, data: bytes) -> None:
        usage, timings, counts = _USAGE_KEYS
        marked = usage in data or timings in data or counts in data
        if not marked:  # a key split between the last piece and this one
            joint = self._edge + data[:_LONGEST_MARKER]
            marked = usage in joint or timings in joint or counts in joint
        if len(data) >= _LONGEST_MARKER:
            self._edge = data[-_LONGEST_MARKER:]
        else:
            self._edge = (self._edge + data)[-_LONGEST_MARKER:]
        self._tail.append((data, marked))
        self._size += len(data)
        self._marked += marked
        self._read = False
        while self._size - len(self._tail[0][0]) >= MAX_TAIL_BYTES:
            if self._tail[0][1] and self._marked == 1:
                self._keep_last_report()  # the tail's only report is leaving it
            piece, was_marked = self._tail.popleft()
            self._size -= len(piece)
            self._marked -= was_marked

    def _keep_last_report(self) -> None:
        found = self._scan()
        if found is not None:
            self._usage = found

    def _scan(self) -> Usage | None:
        events = b"".join(piece for piece, _ in self._tail).split(b"\n\n")
        for event in reversed(events):
            if len(event) <= MAX_EVENT_BYTES and (found := usage_in(event)) is not None:
                return found
        return None

    @property
    def held_bytes(self) -> int:
        return self._size

    @property
    def usage(self) -> Usage | None:
        if not self._read:
            self._read = True
            if self._marked:
                self._keep_last_report()
        return self._usage


class Exchange:
    """One request's record: its model, how long it queued, and its usage."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        self.model: str | None = None
        self.queued_at: float | None = None
        self.leased_at: float | None = None
        self._stream = StreamScanner()
        self._usage: Usage | None = None
        # How the child failed this request, if it did (the proxy says; the lease's release
        # tells the scheduler, which restarts a child that stalls or keeps failing).
        self.child_fault: ChildFault | None = None

    def queued(self, model: str) -> None:
        """The handler knows the canonical model and is about to ask for a lease."""
        self.model = model
        self.queued_at = self._clock()

    def leased(self) -> None:
        self.leased_at = self._clock()

    def body(self, payload: bytes) -> None:
        """The child's whole response body (a JSON answer)."""
        self._usage = usage_in(payload)

    def chunk(self, data: bytes) -> None:
        """One piece of the child's streamed response, in order."""
        self._stream.feed(data)

    @property
    def wait_seconds(self) -> float | None:
        if self.queued_at is None or self.leased_at is None:
            return None
        return self.leased_at - self.queued_at

    @property
    def usage(self) -> Usage | None:
        return self._usage if self._usage is not None else self._stream.usage


EXCHANGE: web.RequestKey[Exchange] = web.RequestKey("corral_exchange", Exchange)


def route_pattern(request: web.Request) -> str | None:
    """The pattern of the route that took ``request`` (``/slots/{id_slot}``), None when none
    did. Metrics label a request by it, never by its path: a label per path a client sends
    grows without bound (4,000 slot ids held 700 MB and a scrape froze the loop 3 min, issue 26
    row 5)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def begin_exchange(request: web.Request, model: str) -> Exchange:
    """The request's exchange, told its model; a detached one when metrics are off."""
    exchange = request.get(EXCHANGE)
    if exchange is None:
        exchange = Exchange()
    exchange.queued(model)
    return exchange
