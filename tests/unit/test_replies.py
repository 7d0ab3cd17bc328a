"""The API's JSON bytes (api/replies.py): orjson where installed, the standard library for what
it refuses, the same bytes either way for what the agent writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from node_agent.api import replies
from node_agent.api.replies import json_bytes


def stdlib(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


LISTING_ENTRY = {
    "id": "qwen-é",
    "aliases": ["q", "模型"],
    "tags": [],
    "created": 1796282117,
    "status": {"value": "loaded", "args": ["--port", "0"], "preset": "[a]\nx = y\n"},
    "corral": {"pid": None, "retry_in": 0.0, "failures": 2, "memory": {"host": 1.5}},
    "can_remove": False,
}


@pytest.mark.parametrize("with_orjson", [True, False])
def test_compact_utf8_json_as_the_standard_library_writes_it(
    with_orjson: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if with_orjson:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(replies, "orjson", None)
    data = {"data": [LISTING_ENTRY] * 3, "object": "list"}
    assert json_bytes(data) == stdlib(data)
    assert json.loads(json_bytes(data)) == data


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"message": "bad \ud800"}, b'{"message":"bad \\ud800"}'),  # a lone surrogate, escaped
        ({"n": 2**64}, b'{"n":18446744073709551616}'),
        ({1: "a"}, b'{"1":"a"}'),
    ],
)
def test_what_orjson_refuses_the_standard_library_writes(data: Any, expected: bytes) -> None:
    assert json_bytes(data) == expected
