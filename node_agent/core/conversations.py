"""Which model serves which conversation, and when a stop cancels a request that waits.

A request with ``X-Conversation-Id`` is remembered (conversation → model) with a *ticket*.
Its child keeps the generation in a session buffer that ``GET /v1/stream`` replays, so the
router must know which child to ask. A stop (``DELETE /v1/stream``) forgets the conversation,
which invalidates the ticket: a request still parked behind its model's load is cancelled
(llama.cpp's router answers it 400 once the load ends; here it ends at once). A newer request of
the same conversation replaces the entry, which cancels an older one still parked, as the
child would replace its session anyway. Pure: no clock, no I/O; the router carries it out.

b11434's ``conv_model_tracker`` (``server-models.h``) is the behaviour reference.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from node_agent.core.model_state import ModelState

# Conversation ids come from clients' headers: an unbounded map would grow with every new id
# (llama.cpp's does). Past this many the least recently remembered are forgotten; a forgotten
# conversation's stream routes answer "not found", and its client starts over.
MAX_CONVERSATIONS = 10_000
# ... and each id is at most this long (llama.cpp's UI sends a UUID, 36 characters), so the book
# holds at most ~2.5 MB of ids: 4,000 ids of 30 KB held 106 MB (issue 26, row 15).
MAX_ID_CHARS = 256


class StreamRoute(enum.Enum):
    """What ``GET /v1/stream`` (and the lookup) does for one conversation."""

    PROXY = "proxy"  # its model's child is ready: ask it
    RETRY = "retry"  # its request waits for a load: 503, the session appears afterwards
    NOT_FOUND = "not_found"  # nothing known: 404


@dataclass(frozen=True)
class Remembered:
    """A request's registration: its ticket (0: no conversation id, nothing remembered) and the
    tickets of older parked requests of the same conversation that it cancels."""

    ticket: int
    cancelled: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Entry:
    model: str
    ticket: int


@dataclass(frozen=True)
class ConversationStatistics:
    conversations: int
    parked: int
    sending: int


class ConversationBook:
    """Conversations by id, their tickets, and the requests parked behind a load."""

    def __init__(self, limit: int = MAX_CONVERSATIONS) -> None:
        self._limit = limit
        self._tickets = itertools.count(1)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._parked: dict[int, str] = {}  # ticket -> its conversation
        self._sending: set[int] = set()  # tickets leased, their request on its way to the child

    def remember(self, conv_id: str, model: str) -> Remembered:
        """Register a request of ``conv_id`` for ``model`` (an empty id registers nothing)."""
        if not conv_id or not model:
            return Remembered(0)
        cancelled = self._cancel_parked(conv_id)
        ticket = next(self._tickets)
        self._entries.pop(conv_id, None)
        self._entries[conv_id] = _Entry(model, ticket)
        while len(self._entries) > self._limit:
            old, _ = self._entries.popitem(last=False)
            cancelled += self._cancel_parked(old)
        return Remembered(ticket, cancelled)

    def alive(self, conv_id: str, ticket: int) -> bool:
        """False once a stop forgot ``conv_id`` or a newer request replaced this one."""
        entry = self._entries.get(conv_id)
        return entry is not None and entry.ticket == ticket

    def owner(self, conv_id: str) -> str | None:
        """The model that serves ``conv_id``'s stream, or None when nothing is known."""
        entry = self._entries.get(conv_id)
        return entry.model if entry is not None else None

    def park(self, conv_id: str, ticket: int) -> bool:
        """The request with ``ticket`` waits for its model's load; False when it is already
        cancelled (it must not wait at all)."""
        if not self.alive(conv_id, ticket):
            return False
        self._parked[ticket] = conv_id
        return True

    def unpark(self, ticket: int) -> None:
        """The parked request got its model (or gave up): a stop no longer cancels its wait."""
        self._parked.pop(ticket, None)

    def sending(self, ticket: int, underway: bool) -> None:
        """The request with ``ticket`` is on its way to its child (``underway``), or done."""
        if underway:
            self._sending.add(ticket)
        else:
            self._sending.discard(ticket)

    def after_miss(self, conv_id: str) -> StreamRoute:
        """The child knows no session for ``conv_id``: a retry while the conversation's current
        request is still on its way there (the child makes the session once it reads it), else
        not found."""
        entry = self._entries.get(conv_id)
        if entry is not None and entry.ticket in self._sending:
            return StreamRoute.RETRY
        return StreamRoute.NOT_FOUND

    def forget(self, conv_id: str) -> tuple[int, ...]:
        """A stop: drop ``conv_id``; returns the tickets of its parked requests, to cancel."""
        self._entries.pop(conv_id, None)
        return self._cancel_parked(conv_id)

    def route(self, conv_id: str, state_of: Callable[[str], ModelState | None]) -> StreamRoute:
        """Where a stream request for ``conv_id`` goes, given each model's state (None: the
        model is gone). A request still parked behind the load earns a retry even when the
        model has just become ready: its session does not exist until the request reaches
        the child."""
        entry = self._entries.get(conv_id)
        if entry is None:
            return StreamRoute.NOT_FOUND
        if entry.ticket in self._parked:
            return StreamRoute.RETRY
        state = state_of(entry.model)
        if state in (ModelState.LOADED, ModelState.SLEEPING):
            return StreamRoute.PROXY
        if state is ModelState.LOADING:
            return StreamRoute.RETRY
        return StreamRoute.NOT_FOUND

    def _cancel_parked(self, conv_id: str) -> tuple[int, ...]:
        tickets = tuple(t for t, c in self._parked.items() if c == conv_id)
        for ticket in tickets:
            del self._parked[ticket]
        return tickets

    def statistics(self) -> ConversationStatistics:
        return ConversationStatistics(
            conversations=len(self._entries), parked=len(self._parked), sending=len(self._sending)
        )


def detaches(ticket: int, ready_on_arrival: bool) -> bool:
    """Whether a request is proxied detached from its client: it carries a conversation and
    had to wait for its model's load. Its client may drop meanwhile (a page reload), and the
    child's session buffer must still receive the generation for a later resume; a request
    whose model was ready keeps llama.cpp's plain behaviour (its client's disconnect ends the
    relay of its answer, once the child has the request)."""
    return ticket != 0 and not ready_on_arrival
