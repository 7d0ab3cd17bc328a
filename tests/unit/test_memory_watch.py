"""MemoryWatch, the ledger at work: its logging and its reads of the devices."""

from __future__ import annotations

import logging
from collections.abc import Collection

import pytest

from node_agent.core.ledger import DeviceReading
from node_agent.memory.devices import CompositeProbe
from node_agent.router.memory import MemoryWatch

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


def test_a_model_that_does_not_fit_is_logged_once_until_it_fits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = CountingProbe(free=2 * GIB)
    memory = watch(probe)
    with caplog.at_level(logging.INFO, logger="corral"):
        for _ in range(216):  # the scheduler asks speculatively, many times per decision
            assert memory.shortfall("m")
        assert caplog.text.count("model=m does not fit now") == 1
        probe.free = 8 * GIB
        memory.refresh()
        assert not memory.shortfall("m")
        probe.free = GIB
        memory.refresh()
        assert memory.shortfall("m")  # short again: a new episode, logged again
    assert caplog.text.count("model=m does not fit now") == 2


def test_statistics_never_read_the_devices() -> None:
    probe = CountingProbe(free=8 * GIB)
    memory = watch(probe)
    reads = probe.reads
    for _ in range(3):
        memory.statistics()
    assert probe.reads == reads
