"""When a streamed answer's next read gathers (core/stream_pace.py): every rule, on a clock
the test moves. A read brings one piece (one event of the child's) unless it says more."""

from __future__ import annotations

import pytest

from node_agent.core.stream_pace import AT_RELEASE, FAST, IMMEDIATE_READS, StreamPace

W = 0.010  # the window


def reads(pace: StreamPace, times: list[float]) -> list[bool]:
    return [pace.read(t) for t in times]


def test_the_first_read_passes_at_once_however_much_it_brings() -> None:
    pace = StreamPace(W)
    assert (IMMEDIATE_READS, FAST) == (2, 3)
    assert not pace.read(0.0, pieces=5)
    assert pace.read(0.0001)  # the second may start a gathering, so the third may wait


def test_a_stream_of_three_pieces_a_window_gathers_from_its_third_read() -> None:
    assert reads(StreamPace(W), [0.0, 0.001, 0.002]) == [False, False, True]
    assert reads(StreamPace(W), [0.0, 0.0045, 0.009]) == [False, False, True]


def test_a_stream_of_two_pieces_a_window_is_read_as_it_comes() -> None:
    """Bench S8's streams (~175 tokens/s): gathering them cost more than it saved."""
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.006, 0.012, 0.018, 0.024, 0.030]) == [False] * 6


def test_a_fast_stream_gathers_again_from_the_read_after_the_one_that_ends_a_gathering() -> None:
    """The read at a release lets the events the child held back for its acknowledgement
    come (Nagle); the read of those starts the next gathering."""
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.001, 0.002]) == [False, False, True]
    pace.released(0.012)
    assert not pace.read(0.0121)  # what waited in the socket
    assert pace.read(0.0122, pieces=12)  # what the child sent once acknowledged
    pace.released(0.0222)
    assert not pace.read(0.0222, pieces=14)  # a child that sends at once: all of them
    assert pace.read(0.0229)  # and its next event


def test_a_stream_that_slows_down_stops_gathering() -> None:
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.001, 0.002]) == [False, False, True]
    pace.released(0.012)
    assert not pace.read(0.0121)
    assert not pace.read(0.0121 + 0.015)  # the next event came a window later
    assert not pace.read(0.0121 + 0.030)


def test_a_stream_that_speeds_up_starts_gathering() -> None:
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.020, 0.040, 0.041, 0.042]) == [False] * 4 + [True]


def test_a_read_during_a_gathering_starts_no_other() -> None:
    """A gathering ends early only for a full buffer or the stream's end; its timer still
    runs, and one gathering at a time is kept."""
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.001, 0.002]) == [False, False, True]
    assert not pace.read(0.003, pieces=200)
    pace.released(0.012)
    assert reads(pace, [0.0121, 0.0122]) == [False, True]


def test_a_read_late_after_a_release_is_judged_by_the_reads_of_its_window() -> None:
    """Not taken for the release's own read (a busy loop came to it late): it starts a
    gathering when the window's reads brought enough pieces."""
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.001, 0.002]) == [False, False, True]
    pace.released(0.012)
    assert not pace.read(0.012 + 2 * AT_RELEASE)  # one piece in its window
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.001, 0.002]) == [False, False, True]
    pace.released(0.012)
    assert pace.read(0.012 + 2 * AT_RELEASE, pieces=3)


def test_a_read_exactly_one_window_after_the_others_counts_alone() -> None:
    pace = StreamPace(W)
    assert reads(pace, [0.0, 0.0, W]) == [False, False, False]


@pytest.mark.parametrize("times", [[0.0, 0.0, 0.0, 0.0], [0.0, 0.001, 0.002, 0.003]])
def test_a_window_of_zero_never_gathers(times: list[float]) -> None:
    pace = StreamPace(0.0)
    assert [pace.read(t, pieces=10) for t in times] == [False] * len(times)
