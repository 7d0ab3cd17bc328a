"""Usage parsing of children's responses (node_agent.api.request_record): bodies and streams."""

from __future__ import annotations

import json

from node_agent.api.request_record import (
    MAX_EVENT_BYTES,
    MAX_TAIL_BYTES,
    Exchange,
    StreamScanner,
    Usage,
    usage_in,
)

OPENAI = {
    "choices": [{"message": {"content": 'she said "usage": 1'}}],
    "usage": {"completion_tokens": 4, "prompt_tokens": 22, "total_tokens": 26},
    "timings": {"prompt_n": 1, "prompt_ms": 2.0, "predicted_n": 4, "predicted_ms": 8.0},
}


def sse(*messages: object) -> bytes:
    return b"".join(f"data: {json.dumps(m)}\n\n".encode() for m in messages) + b"data: [DONE]\n\n"


def test_usage_wins_over_timings_which_count_only_uncached_tokens() -> None:
    assert usage_in(json.dumps(OPENAI).encode()) == Usage(22, 4, 0.002, 0.008)


def test_anthropic_and_completion_shapes() -> None:
    anthropic = {"usage": {"input_tokens": 9, "output_tokens": 3}}
    assert usage_in(json.dumps(anthropic).encode()) == Usage(9, 3)
    completion = {"content": "x", "tokens_evaluated": 7, "tokens_predicted": 2,
                  "timings": {"prompt_n": 7, "predicted_n": 2, "predicted_ms": 10}}  # fmt: skip
    assert usage_in(json.dumps(completion).encode()) == Usage(7, 2, None, 0.01)


def test_bodies_without_usage() -> None:
    assert usage_in(b'{"tokens": [1, 2, 3]}') is None
    assert usage_in(b"not json at all") is None
    assert usage_in(b'{"usage": "nonsense"}') is None


def test_stream_usage_is_the_last_reported_even_split_anywhere() -> None:
    body = sse(
        {"choices": [{"delta": {"content": "a"}}], "timings": {"predicted_n": 1}},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    )
    for size in (1, 2, 3, 7, 64, len(body)):
        scanner = StreamScanner()
        for at in range(0, len(body), size):
            scanner.feed(body[at : at + size])
        assert scanner.usage == Usage(5, 2), size


def test_an_oversized_event_is_skipped_and_the_stream_never_buffered() -> None:
    scanner = StreamScanner()
    scanner.feed(b"data: " + b'"usage"' + b"x" * MAX_EVENT_BYTES)
    scanner.feed(b"y" * 100 + b"\n\n")
    assert scanner.usage is None
    scanner.feed(sse({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}))
    assert scanner.usage == Usage(1, 1)
    for _ in range(10_000):  # a long stream after it: only its tail is held
        scanner.feed(sse({"choices": [{"delta": {"content": "token"}}]}))
    assert scanner.held_bytes <= MAX_TAIL_BYTES + 100
    assert scanner.usage == Usage(1, 1)  # the last report, though it left the tail


def test_a_report_that_leaves_the_tail_unread_is_still_the_last_one() -> None:
    scanner = StreamScanner()
    scanner.feed(sse({"usage": {"prompt_tokens": 3, "completion_tokens": 4}}))
    for _ in range(10_000):  # never asked for the usage meanwhile
        scanner.feed(sse({"choices": [{"delta": {"content": "token"}}]}))
    assert scanner.held_bytes <= MAX_TAIL_BYTES + 100
    assert scanner.usage == Usage(3, 4)
    scanner.feed(sse({"usage": {"prompt_tokens": 3, "completion_tokens": 9}}))
    assert scanner.usage == Usage(3, 9)


def test_exchange_times_the_queue() -> None:
    now = iter([10.0, 11.0, 13.5])
    exchange = Exchange(clock=lambda: next(now))
    assert exchange.wait_seconds is None
    exchange.queued("m")
    exchange.leased()
    assert (exchange.model, exchange.wait_seconds) == ("m", 2.5)
    exchange.body(json.dumps(OPENAI).encode())
    assert exchange.usage == Usage(22, 4, 0.002, 0.008)
