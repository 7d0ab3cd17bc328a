"""The API's JSON replies: one body format for answers and errors, llama.cpp's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from node_agent.errors import ApiError


def json_reply(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    try:
        body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate (``"\ud800"`` is valid JSON) echoed back in an error message cannot
        # be UTF-8: escape it rather than fail the request with a 500.
        body = json.dumps(data, separators=(",", ":")).encode()
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def error_response(error: ApiError) -> web.Response:
    return json_reply(error.body(), error.status, error.headers)
