"""The API's JSON replies: one body format for answers and errors, llama.cpp's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

try:
    import orjson
except ImportError:  # no wheel for this platform (pyproject.toml): the standard library
    orjson = None  # type: ignore[assignment]

from node_agent.errors import ApiError


def json_bytes(data: Any) -> bytes:
    """``data`` as compact UTF-8 JSON, as llama.cpp writes it. orjson, where it is installed,
    writes GET /models with 1,000 models in 1.2 ms where the standard library took 19 ms
    (about half the listing's time). What it refuses (a lone surrogate, an integer past 64
    bits, a key that is not a string) goes to the standard library; the two write the same
    bytes but for some floats' form (1e-05 against 0.00001) and NaN (null, as llama.cpp
    writes it, against NaN, which is no JSON)."""
    if orjson is not None:
        with contextlib.suppress(TypeError):  # (orjson.JSONEncodeError is one)
            return orjson.dumps(data)
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate (``"\ud800"`` is valid JSON) echoed back in an error message cannot
        # be UTF-8: escape it rather than fail the request with a 500.
        return json.dumps(data, separators=(",", ":")).encode()


def json_reply(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = json_bytes(data)
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def error_response(error: ApiError) -> web.Response:
    return json_reply(error.body(), error.status, error.headers)
