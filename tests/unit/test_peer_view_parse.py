"""A peer's view is input like any other: ``parse_view`` takes what is well formed and names
what is not (``api/peers.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from node_agent.api.peers import MAX_VIEW_BYTES, _lines, parse_view


def test_a_view_is_read_whole() -> None:
    line = (
        b'{"models_max":2,"models":{"m":["loaded",3]},"needs":{"m":{"CUDA0":5}},'
        b'"free":{"CUDA0":9,"host":null}}'
    )
    assert parse_view(line) == (
        2,
        {"m": ("loaded", 3)},
        {"m": {"CUDA0": 5}},
        {
            "CUDA0": 9,
            "host": None,
        },
    )
    ledger_off = b'{"models_max":0,"models":{},"needs":{},"free":null}'
    assert parse_view(ledger_off) == (0, {}, {}, None)


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[]",
        b'{"models":{}}',
        b'{"models_max":-1,"models":{},"needs":{},"free":null}',
        b'{"models_max":true,"models":{},"needs":{},"free":null}',
        b'{"models_max":1,"models":{"m":["loaded",-2]},"needs":{},"free":null}',
        b'{"models_max":1,"models":{"m":["loaded"]},"needs":{},"free":null}',
        b'{"models_max":1,"models":{"m":[3,1]},"needs":{},"free":null}',
        b'{"models_max":1,"models":[],"needs":{},"free":null}',
    ],
)
def test_a_malformed_view_is_refused_with_a_reason(line: bytes) -> None:
    with pytest.raises(ValueError, match="a malformed view"):
        parse_view(line)


def test_a_deeply_nested_view_is_refused_not_a_crash() -> None:
    with pytest.raises(ValueError, match="a malformed view"):
        parse_view(b"[" * 200_000)


def test_free_memory_may_be_negative_but_not_a_boolean() -> None:
    line = b'{"models_max":1,"models":{},"needs":{},"free":{"a":-5,"b":true,"c":null}}'
    assert parse_view(line)[3] == {"a": -5, "c": None}


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_lines_are_read_whole_and_bounded() -> None:
    lines = _lines(_chunks(b"one\ntw", b"o\n\nthree", b"\n"))
    assert [line async for line in lines] == [b"one", b"two", b"", b"three"]
    huge = _lines(_chunks(*[b"x" * 65536] * (MAX_VIEW_BYTES // 65536 + 2)))
    with pytest.raises(ValueError, match="a view over"):
        [line async for line in huge]
