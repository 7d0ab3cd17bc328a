"""MemoryWatch, the ledger at work: its logging and its reads of the devices."""

from __future__ import annotations

import logging
from collections.abc import Collection

import pytest

from node_agent.core.ledger import DeviceReading
from node_agent.memory.devices import CompositeProbe
from node_agent.runtime.memory_watch import MemoryWatch

GIB = 1 << 30


class CountingProbe:
    """A device probe that counts its reads; ``free`` is what it reports."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.reads = 0

    def read(self) -> list[DeviceReading]:
        self.reads += 1
        return [DeviceReading("CUDA0", 10 * GIB, self.free)]

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        return {}


def watch(probe: CountingProbe) -> MemoryWatch:
    memory = MemoryWatch(margin_mib=0, limits={}, probe=CompositeProbe([probe]))
    memory.ledger.set_estimate("m", {"CUDA0": 4 * GIB})
    memory.refresh()
    return memory


def test_the_rooms_questions_change_nothing_and_log_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The scheduler asks speculatively, many times per decision: the answers are pure (issue
    27: the room used to replan, change the ledger and log from inside the scheduler)."""
    probe = CountingProbe(free=2 * GIB)
    memory = watch(probe)
    before = memory.ledger.statistics()
    reads = probe.reads
    with caplog.at_level(logging.DEBUG, logger="corral"):
        for _ in range(216):
            assert memory.shortfall("m", [])
            assert memory.pick_victim("m", []) is None
    assert caplog.text == ""
    assert memory.ledger.statistics() == before
    assert probe.reads == reads
    probe.free = 8 * GIB
    memory.refresh()
    assert not memory.shortfall("m", [])


def test_statistics_never_read_the_devices() -> None:
    probe = CountingProbe(free=8 * GIB)
    memory = watch(probe)
    reads = probe.reads
    for _ in range(3):
        memory.statistics()
    assert probe.reads == reads
