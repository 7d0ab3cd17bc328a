"""When the proxy may close a child's connections (the pure LinkBook)."""

from __future__ import annotations

from node_agent.core.links import LinkBook


def test_an_idle_link_is_closed_as_soon_as_its_child_is_retired() -> None:
    book = LinkBook()
    link, replaced = book.add(8001)
    assert replaced is None and book.current(8001) == link
    assert book.retire(8001) == link
    assert book.current(8001) is None
    assert book.statistics().links == 0


def test_a_busy_link_closes_only_when_its_last_user_is_done() -> None:
    book = LinkBook()
    link, _ = book.add(8001)
    book.enter(link)
    book.enter(link)
    assert book.retire(8001) is None  # two streams still read it
    assert book.current(8001) is None  # but no new request uses it
    assert book.statistics().retired == 1
    assert not book.leave(link)
    assert book.leave(link)  # the last one: close it now
    assert book.statistics().links == 0


def test_a_port_taken_by_a_new_child_gets_a_new_link() -> None:
    book = LinkBook()
    old, _ = book.add(8001)
    book.enter(old)
    assert book.retire(8001) is None
    new, replaced = book.add(8001)
    assert new != old and replaced is None
    book.enter(new)
    assert book.leave(old)  # the old child's stream ends: its link closes
    assert not book.leave(new)  # the new one stays
    assert book.current(8001) == new


def test_replacing_an_idle_link_closes_it_and_a_busy_one_later() -> None:
    book = LinkBook()
    first, _ = book.add(8001)
    second, replaced = book.add(8001)
    assert replaced == first
    book.enter(second)
    third, replaced = book.add(8001)
    assert replaced is None
    assert book.leave(second)
    assert book.idle() == [third]
    assert book.users(third) == 0


def test_retiring_an_unknown_port_is_a_no_op() -> None:
    assert LinkBook().retire(9) is None
