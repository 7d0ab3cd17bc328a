"""Ollama's keep_alive values, parsed."""

from __future__ import annotations

import pytest

from node_agent.errors import ApiError
from node_agent.runtime.ttl import parse_keep_alive


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (30, 30.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("45", 45.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("250ms", 0.25),
        (" 10 s ", 10.0),
        (-1, None),
        ("-1", None),
        ("-5m", None),
    ],
)
def test_keep_alive_values(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize(
    "value",
    # NaN, Infinity and 1e400 are what Python's JSON reader makes of those body values
    ["soon", "5x", "", None, True, [1], {"s": 1}, float("nan"), float("inf"), 1e400, "-", "-x"],
)
def test_bad_keep_alive_is_a_clear_400(value: object) -> None:
    with pytest.raises(ApiError) as caught:
        parse_keep_alive(value)
    assert caught.value.status == 400
    assert "keep_alive" in caught.value.message


@pytest.mark.parametrize(
    "value",
    [
        "1" + " " * 100_000 + "x",
        " " * 100_000 + "1x",
        "1" * 100_000 + "x",
        ["5m"] * 100_000,
        10**400,
    ],
)
def test_a_huge_keep_alive_is_refused_at_once_and_echoed_short(value: object) -> None:
    # Issue 26: `\s*` on both sides of an optional unit was quadratic (20 KB: 3.7 s on the loop).
    import time

    start = time.perf_counter()
    with pytest.raises(ApiError) as raised:
        parse_keep_alive(value)
    assert time.perf_counter() - start < 0.5
    assert raised.value.status == 400 and len(raised.value.message) < 500
