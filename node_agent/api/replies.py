"""The API's JSON replies: one body format for answers and errors, llama.cpp's."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

try:
    import orjson
except ImportError:  # no wheel for this platform (pyproject.toml): the standard library
    orjson = None  # type: ignore[assignment]

from node_agent.errors import ApiError

# llama.cpp's answer to a feature its child was not started with: 501 and "This server does
# not support embeddings. Start it with `--embeddings`" (b11434's server-context.cpp, for
# embeddings, reranking, metrics, slots and props; its router passes the child's answer on).
# A Corral user starts no child: the preset key does it. (Matched on the child's own message,
# at most MAX_FIX_MESSAGE characters of it.)
_START_WITH: Final = re.compile(r"Start it with `--([a-z][a-z0-9-]{0,40})`")
MAX_FIX_MESSAGE: Final = 2000
# The openai SDKs retry every 5xx twice, with back-off, unless the answer says not to
# (openai-python's and openai-node's ``x-should-retry``): a missing feature stays missing.
NO_RETRY: Final = ("x-should-retry", "false")


def with_preset_fix(message: str, model: str | None) -> str:
    """llama.cpp's "Start it with `--X`" message, then what a Corral user does instead: the
    preset key (``X = true`` for a flag). Any other message as it is."""
    from node_agent.sources.options import llama_options  # the table in use

    found = _START_WITH.search(message[:MAX_FIX_MESSAGE])
    if found is None:
        return message
    key = found.group(1)
    match = llama_options().flag(f"--{key}")
    setting = f"`{key} = true`" if match is not None and match.option.is_flag else f"`{key}`"
    where = f"the preset of model '{model}'" if model else "the model's preset"
    return (
        f"{message} (with Corral: set {setting} in {where}, or give --{key} to corral agent "
        "for every model)"
    )


def child_error_with_fix(payload: bytes, model: str | None) -> bytes:
    """A child's JSON error answer (``{"error": {"message": …}}``) with :func:`with_preset_fix`
    applied to its message; anything else as it came."""
    try:
        document = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return payload
    error = document.get("error") if isinstance(document, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        return payload
    fixed = with_preset_fix(message, model)
    if fixed == message:
        return payload
    assert isinstance(error, dict)  # (mypy: narrowed above)
    error["message"] = fixed
    return json_bytes(document)


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
