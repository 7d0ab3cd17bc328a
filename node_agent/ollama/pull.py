"""``POST /api/pull``: a model from Hugging Face, as ``POST /models`` downloads it, with
Ollama's NDJSON progress (``status``, ``digest``, ``total``, ``completed``).

Ollama's own library (``llama3.2``) is not reachable from here: a name must be a Hugging Face
repository, ``org/repo[:QUANT]``, or Ollama's way of naming one, ``hf.co/org/repo[:QUANT]``.
The progress comes from the download's ``download_progress`` events (the ones
``/models/sse`` carries); ``digest`` is the file's name, which is what Ollama's clients group a
progress bar by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

from aiohttp import web

from node_agent.api.state import STATE
from node_agent.errors import ApiError
from node_agent.ollama.listing import HF_PREFIXES, find
from node_agent.ollama.translate import model_name
from node_agent.runtime.event_hub import Event

if TYPE_CHECKING:
    from node_agent.runtime.registry import Registry

NDJSON: Final = "application/x-ndjson"
PULL_KEYS: Final = frozenset({"model", "name", "insecure", "stream"})
_ENDS: Final = frozenset({"download_finished", "download_failed"})


def repo_name(given: str) -> str:
    """``org/repo[:QUANT]`` from what an Ollama client pulls; 400 for Ollama's library."""
    name = given
    for prefix in HF_PREFIXES:
        name = name.removeprefix(prefix)
    name = name.removesuffix(":latest")
    if name.count("/") != 1:
        raise ApiError(
            400,
            f"cannot pull {given[:200]!r}: Corral downloads from Hugging Face, give "
            "org/repo[:QUANT] or hf.co/org/repo[:QUANT] (Ollama's own library is not reachable)",
        )
    return name


def _progress_lines(data: dict[str, Any] | None) -> list[dict[str, Any]]:
    progress = data.get("progress") if isinstance(data, dict) else None
    lines = []
    for url, figures in progress.items() if isinstance(progress, dict) else ():
        if not isinstance(figures, dict):
            continue
        file = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or url
        lines.append(
            {
                "status": f"pulling {file}",
                "digest": file,
                "total": figures.get("total", 0),
                "completed": figures.get("done", 0),
            }
        )
    return lines


async def pull(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    extra = sorted(key for key in body if key not in PULL_KEYS)
    if extra:
        raise ApiError(400, f"/api/pull does not take {', '.join(map(repr, extra))[:300]}")
    if body.get("insecure"):
        raise ApiError(400, "insecure pulls are not supported: Hugging Face is reached over TLS")
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false")
    name = repo_name(model_name(body))
    registry = request.app[STATE].registry
    # Subscribed before the download starts, so no event of it is missed: the subscription is
    # made by the first step of the generator, run now as a task of this handler (cancelled
    # below, whatever happens).
    events = registry.events()
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0)
    try:
        existed = registry.resolve(name) is not None
        if not existed:
            await registry.downloads.start_repo(
                name, exists=lambda n: registry.resolve(n) is not None
            )
        if not stream:
            failure = await _until_over(registry, name, first, events, None)
            if failure is not None:
                raise ApiError(500, failure)
            return web.json_response({"status": "success"})
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(_line({"status": "pulling manifest"}))
        failure = None
        if not existed:
            failure = await _until_over(registry, name, first, events, response)
        await response.write(_line({"error": failure} if failure else {"status": "success"}))
        await response.write_eof()
        return response
    finally:
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await first
        await events.aclose()


async def _until_over(
    registry: Registry,
    name: str,
    first: asyncio.Future[Event],
    events: AsyncGenerator[Event, None],
    response: web.StreamResponse | None,
) -> str | None:
    """Relay ``name``'s download progress (to ``response``, when streaming) until the
    download is over; why it failed, or None."""
    event = await first
    while not (event.model == name and event.event in _ENDS):
        if event.model == name and event.event == "download_progress" and response is not None:
            for line in _progress_lines(event.data):
                await response.write(_line(line))
        event = await anext(events)
    # The model is listed once the download's reload has run: wait for the download's end.
    await registry.downloads.wait(name, queue_timeout=None, left=None, max_queue=None)
    if find(registry, name) is not None:
        return None
    why = registry.downloads.failed(name) or "the download made no model"
    return f"pulling {name} failed: {why}"


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, ensure_ascii=False).encode() + b"\n"
