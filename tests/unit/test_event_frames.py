"""core/event_frames: server-sent events pass on whole, whatever the chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from node_agent.core.event_frames import MAX_HELD, EventFrames

EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'


def test_whole_events_pass_at_once() -> None:
    frames = EventFrames()
    assert frames.feed(EVENT * 3) == EVENT * 3
    assert frames.rest() == b""


def test_half_an_event_is_held_until_it_ends() -> None:
    frames = EventFrames()
    assert frames.feed(EVENT + EVENT[:20]) == EVENT
    assert frames.feed(EVENT[20:-1]) == b""
    assert frames.feed(b"\n") == EVENT


def test_crlf_boundaries_and_a_last_event_without_one() -> None:
    frames = EventFrames()
    assert frames.feed(b"data: 1\r\n\r\ndata: 2\r\n") == b"data: 1\r\n\r\n"
    assert frames.rest() == b"data: 2\r\n"  # at the stream's own end, passed on
    assert frames.rest() == b""


def test_a_stream_without_boundaries_is_not_held_without_bound() -> None:
    frames = EventFrames()
    assert frames.feed(b"x" * MAX_HELD) == b""
    assert frames.feed(b"y") == b"x" * MAX_HELD + b"y"


def test_a_boundary_split_byte_by_byte_is_found() -> None:
    frames = EventFrames()
    assert [frames.feed(bytes([b])) for b in b"data: 1\r\n\r\n"][-1] == b"data: 1\r\n\r\n"
    assert frames.rest() == b""


@given(
    st.lists(
        st.sampled_from([EVENT, b": keepalive\n\n", b"data: 1\r\n\r\n", b"data: [DONE]\n\n"]),
        max_size=8,
    ),
    st.lists(st.integers(min_value=1, max_value=40), max_size=60),
)
def test_any_split_passes_the_same_bytes_and_only_whole_events(
    events: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(events)
    frames, out, at = EventFrames(), [], 0
    for size in [*cuts, len(stream)]:
        piece = frames.feed(stream[at : at + size])
        assert piece == b"" or piece.endswith((b"\n\n", b"\r\n\r\n"))
        out.append(piece)
        at += size
    # Every boundary is found however the chunks split it: nothing whole stays held.
    assert frames.rest() == b""
    assert b"".join(out) == stream
