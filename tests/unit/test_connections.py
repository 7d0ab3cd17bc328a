"""Which connection makes room at ``--max-connections`` (issue 16, row 6)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from node_agent.api.connections import GRACE_SECONDS, _victim, mark_receiving


class Conn:
    """What ``_victim`` reads of aiohttp's RequestHandler (hashable, by identity)."""

    def __init__(self, *, busy: bool, closing: bool) -> None:
        self.transport = SimpleNamespace(is_closing=lambda: closing)
        self._current_request = object() if busy else None


def conn(*, busy: bool = False, closing: bool = False) -> Any:
    return Conn(busy=busy, closing=closing)


def test_the_oldest_idle_past_the_grace_goes_first() -> None:
    old_busy, old_idle, young_idle = conn(busy=True), conn(), conn()
    since = {old_busy: 0.0, old_idle: 1.0, young_idle: 9.5}
    assert _victim([old_busy, old_idle, young_idle], since, now=10.0) is old_idle


def test_then_one_still_sending_its_body_then_the_newest_idle() -> None:
    sending, busy, young_a, young_b = conn(busy=True), conn(busy=True), conn(), conn()
    since = {sending: 0.0, busy: 0.0, young_a: 10.0 - GRACE_SECONDS / 2, young_b: 10.0}
    mark_receiving(sending, True)
    try:
        assert _victim([busy, sending, young_a, young_b], since, now=10.0) is sending
    finally:
        mark_receiving(sending, False)
    # A flood of fresh connections pushes out its own newest, not the probe that came first.
    assert _victim([busy, young_a, young_b], since, now=10.0) is young_b


def test_closed_ones_are_skipped_and_all_busy_means_none() -> None:
    closing, busy = conn(closing=True), conn(busy=True)
    assert _victim([closing, busy], {closing: 0.0, busy: 0.0}, now=10.0) is None
