"""A peer's view is input like any other: ``parse_view`` takes what is well formed and names
what is not (``api/peers.py``)."""

from __future__ import annotations

import pytest

from node_agent.api.peers import parse_view


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
