"""The conversation book: tickets, stops that cancel a parked request, stream routes."""

from __future__ import annotations

from node_agent.core.conversations import ConversationBook, StreamRoute, detaches
from node_agent.core.model_state import ModelState


def test_an_empty_id_registers_nothing() -> None:
    book = ConversationBook()
    assert book.remember("", "m").ticket == 0
    assert book.owner("") is None
    assert not detaches(0, ready_on_arrival=False)


def test_a_ticket_lives_until_a_stop_or_a_newer_request() -> None:
    book = ConversationBook()
    first = book.remember("org/repo::chat-1", "m").ticket
    assert book.alive("org/repo::chat-1", first)
    assert book.owner("org/repo::chat-1") == "m"
    second = book.remember("org/repo::chat-1", "n").ticket
    assert second != first
    assert not book.alive("org/repo::chat-1", first)
    assert book.alive("org/repo::chat-1", second)
    assert book.owner("org/repo::chat-1") == "n"
    assert book.forget("org/repo::chat-1") == ()
    assert not book.alive("org/repo::chat-1", second)
    assert book.owner("org/repo::chat-1") is None


def test_a_stop_cancels_the_request_parked_behind_the_load() -> None:
    book = ConversationBook()
    ticket = book.remember("c", "m").ticket
    assert book.park("c", ticket)
    assert book.statistics().parked == 1
    assert book.forget("c") == (ticket,)
    assert book.statistics().parked == 0
    assert not book.alive("c", ticket)


def test_a_newer_request_cancels_the_older_parked_one() -> None:
    book = ConversationBook()
    old = book.remember("c", "m").ticket
    book.park("c", old)
    newer = book.remember("c", "m")
    assert newer.cancelled == (old,)
    assert book.alive("c", newer.ticket)


def test_a_cancelled_ticket_cannot_park() -> None:
    book = ConversationBook()
    ticket = book.remember("c", "m").ticket
    book.forget("c")
    assert not book.park("c", ticket)
    assert book.statistics().parked == 0


def test_an_unparked_request_is_not_cancelled_by_a_stop() -> None:
    book = ConversationBook()
    ticket = book.remember("c", "m").ticket
    book.park("c", ticket)
    book.unpark(ticket)
    assert book.forget("c") == ()


def test_the_oldest_conversations_go_past_the_limit() -> None:
    book = ConversationBook(limit=2)
    a = book.remember("a", "m").ticket
    book.park("a", a)
    book.remember("b", "m")
    # "a" is the least recently remembered: dropped, and its parked request cancelled.
    assert book.remember("c", "m").cancelled == (a,)
    assert book.owner("a") is None
    assert book.owner("b") == "m"
    assert book.statistics().conversations == 2
    # Remembering again makes a conversation the most recent.
    book.remember("b", "m")
    book.remember("d", "m")
    assert book.owner("b") == "m"
    assert book.owner("c") is None


def test_stream_routes() -> None:
    book = ConversationBook()
    seen: dict[str, ModelState] = {}
    assert book.route("c", seen.get) is StreamRoute.NOT_FOUND
    ticket = book.remember("c", "m").ticket
    book.park("c", ticket)
    # Parked: retry, whatever the model's state (the session appears once the request is sent).
    for state in (*ModelState, None):
        assert book.route("c", lambda _m, s=state: s) is StreamRoute.RETRY
    book.unpark(ticket)
    expected = {
        ModelState.LOADED: StreamRoute.PROXY,
        ModelState.SLEEPING: StreamRoute.PROXY,
        ModelState.LOADING: StreamRoute.RETRY,
        ModelState.UNLOADED: StreamRoute.NOT_FOUND,
        None: StreamRoute.NOT_FOUND,
    }
    for state, route in expected.items():
        assert book.route("c", lambda _m, s=state: s) is route, state


def test_only_a_conversation_that_waited_detaches() -> None:
    assert detaches(7, ready_on_arrival=False)
    assert not detaches(7, ready_on_arrival=True)
    assert not detaches(0, ready_on_arrival=True)


def test_a_miss_while_the_request_is_on_its_way_is_a_retry() -> None:
    book = ConversationBook()
    ticket = book.remember("c", "m").ticket
    assert book.after_miss("c") is StreamRoute.NOT_FOUND
    book.sending(ticket, True)
    assert book.after_miss("c") is StreamRoute.RETRY
    assert book.statistics().sending == 1
    # A newer request of the conversation: the old one's session is not the one asked for.
    newer = book.remember("c", "m").ticket
    assert book.after_miss("c") is StreamRoute.NOT_FOUND
    book.sending(newer, True)
    book.sending(ticket, False)
    assert book.after_miss("c") is StreamRoute.RETRY
    book.sending(newer, False)
    assert book.after_miss("c") is StreamRoute.NOT_FOUND
    assert book.after_miss("unknown") is StreamRoute.NOT_FOUND
