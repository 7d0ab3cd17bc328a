"""Every ``/models`` route in one place.

llama.cpp's router's: ``GET /models`` (and ``/v1/models``), ``POST /models/load``,
``POST /models/unload`` and the ``/models/sse`` event stream. b11434's models API (its
``tools/server/server-models.cpp``), with the same status codes, messages and shapes:

* ``POST /models {"model": "org/repo[:quant]"}`` -> ``{"success": true}`` once the download is
  on its way; 400 ``model must be a non-empty string``, 400 with llama.cpp's
  ``error: invalid HF repo format…``, 400 ``model 'X' already exists``;
* ``DELETE /models?model=X`` -> ``{"success": true}`` after the model's child (or download) is
  gone and its files are out of the cache; 400 ``model must be a non-empty string``, 500
  ``model name=X is not found``, 500 ``model name=X is not removable (not from cache)``;
  ``model_remove`` on ``/models/sse``;
* while a download is on its way, ``GET /models`` lists the model as ``downloading``.

Deliberate differences (docs/downloads.md; each has a test): ``/models/load`` for an unknown
or missing model says which (llama.cpp's 404 body is only "File Not Found"); a name the Hub has
no model file for is refused with 400 (llama.cpp starts a download that "finishes" with
nothing); a download sharing files with one on its way is refused with 400 (llama.cpp lets
both write the same partial file); a request for a downloading model waits for it (llama.cpp
answers 400 ``model name=X is not running``); a field besides ``model`` is refused with 400
(llama.cpp ignores it).

And Corral's ``GET /models/logs?model=X``: a model's llama-server output. Children's stderr
never goes into the agent's own log (it would drown it); each model keeps a ring of its last
lines, across restarts, so a crash's last words stay readable. ``lines=N`` limits the answer
to the newest N lines; ``follow=1`` keeps the response open and streams new lines as the child
writes them (plain text, one line each), like ``tail -f``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web

from node_agent.api.bodies import (
    MODEL_MISSING,
    body_model,
    parse_json_body,
    read_control_body,
    read_json,
)
from node_agent.api.conversations import CONVERSATIONS
from node_agent.api.long_lived import until_shutdown
from node_agent.api.replies import json_bytes, json_reply
from node_agent.api.state import STATE, AgentState, LogsFor
from node_agent.api.tenants import request_tenant
from node_agent.api.views import model_entry
from node_agent.child.ports import CHILD_HOST
from node_agent.clip import clip
from node_agent.errors import ApiError
from node_agent.sources import hf_hub
from node_agent.sources.options import llama_options
from node_agent.sources.spec import SOURCE_CACHE
from node_agent.sources.trust import option_refusal

# How long GET /models waits for the estimates it lacks (GGUF headers read, figures made); a
# model whose estimate takes longer is listed without figures this time (the work goes on,
# bounded, off the loop).
LIST_HEADER_WAIT = 1.0
LIST_SLICE = 100  # models listed between two turns of the loop (2 ms here)
LIST_REUSE_SECONDS = 0.5  # how long one listing's body serves others (the runtime unchanged)


async def list_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if request.query.get("reload", "").lower() in ("1", "true", "yes", "on"):
        await state.reload()
    streams = request.app[CONVERSATIONS].supported
    body = await request.app[LISTING].body(state, streams)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


class _SharedListing:
    """The last ``GET /models`` body, shared by the listings of one state of the runtime
    within :data:`LIST_REUSE_SECONDS`: four clients listing 10,000 models at once made four
    listings of 230 ms each, and /health waited behind their slices (issue 50, row 7). A
    listing that arrives while one is being made waits for it; a change of the runtime
    (``Registry.stamp``) or the time makes the next one anew."""

    def __init__(self) -> None:
        self._key: tuple[tuple[int, int], int, bool | None] | None = None
        self._body: asyncio.Future[bytes] | None = None

    async def body(self, state: AgentState, streams: bool | None) -> bytes:
        key = (state.registry.stamp(), int(time.monotonic() / LIST_REUSE_SECONDS), streams)
        shared = self._body
        if key == self._key and shared is not None:
            with contextlib.suppress(_Unshared):
                return await asyncio.shield(shared)
        made: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._key, self._body = key, made
        try:
            body = json_bytes(await _listing(state, streams))
        except BaseException:
            made.set_exception(_Unshared())  # those who wait for it make their own
            made.exception()  # (retrieved: nobody need wait for it)
            if self._body is made:
                self._key = self._body = None
            raise
        made.set_result(body)
        return body


class _Unshared(Exception):
    """The listing being made for others did not finish (its client went away)."""


LISTING: web.AppKey[_SharedListing] = web.AppKey("corral_listing", _SharedListing)


async def _listing(state: AgentState, streams: bool | None) -> dict[str, Any]:
    registry = state.registry
    if registry.memory is not None:
        # The memory figures: each model's GGUF header read and its estimate made off the
        # loop, once per file version, waited for a bounded time (a crafted header froze
        # GET /models: issue 26, row 6).
        await registry.memory.prepare_off_loop(registry.listed().values(), wait=LIST_HEADER_WAIT)
    now = int(time.time())
    data = []
    for count, name in enumerate(list(registry.listed())):
        if count and count % LIST_SLICE == 0:
            # The loop serves everyone: a listing of 10,000 models lets /health and the other
            # requests in between slices (issue 50, row 7).
            await asyncio.sleep(0)
        if name in registry.specs():  # (one gone meanwhile is left out)
            data.append(model_entry(registry, name, state.binary, now, streams))
    data += download_entries(state, now)
    body: dict[str, Any] = {"data": data, "object": "list"}
    refused = state.refused() if state.refused is not None else []
    if refused:  # Corral: restricted presets refused alone (absent when none)
        from node_agent.models_schema import dump  # lazily, as views does (start-up time)

        body["refused"] = [dump(r) for r in refused]
    return body


async def retrieve_model(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models/{id}`` (OpenAI's ``models.retrieve``): the entry ``GET /v1/models``
    lists for the model, found by its name or an alias (ids hold slashes: ``org/repo:Q4``).
    llama.cpp's router has no such route (404 ``File Not Found``); only OpenAI defines it."""
    state = request.app[STATE]
    registry = state.registry
    given = request.match_info["model"]
    name = registry.resolve(given)
    now = int(time.time())
    if name is not None and name in registry.specs():  # listed, or hidden but usable by name
        if registry.memory is not None:
            spec = registry.spec(name)
            await registry.memory.prepare_off_loop([spec], wait=LIST_HEADER_WAIT)
        streams = request.app[CONVERSATIONS].supported
        return json_reply(model_entry(registry, name, state.binary, now, streams))
    for entry in download_entries(state, now):
        if entry["id"] == given:
            return json_reply(entry)
    raise ApiError(404, f"model '{clip(given)}' not found")


async def load_model(request: web.Request) -> web.StreamResponse:
    """llama.cpp answers 404 for a missing or unknown model here; we keep the status and say
    which (a listed difference: its body is only "File Not Found")."""
    registry = request.app[STATE].registry
    model = body_model((await read_json(request))[1])
    if model is None:
        raise ApiError(404, MODEL_MISSING)
    canonical = registry.resolve(model)
    if canonical is None:
        raise ApiError(404, f"model '{clip(model)}' not found")
    await registry.load(canonical, tenant=request_tenant(request))
    return json_reply({"success": True})


async def unload_model(request: web.Request) -> web.StreamResponse:
    """llama.cpp answers a missing or unknown model here with 400 ``model is not found``."""
    registry = request.app[STATE].registry
    model = body_model((await read_json(request))[1])
    canonical = registry.resolve(model) if model is not None else None
    if canonical is None:
        raise ApiError(400, "model is not found")
    registry.unload(canonical)
    return json_reply({"success": True})


async def models_sse(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for event in until_shutdown(request.app, registry.events()):
            message: dict[str, Any] = {"model": event.model, "event": event.event}
            if event.data is not None:
                message["data"] = event.data
            line = f"data: {json.dumps(message, separators=(',', ':'))}\n\n"
            await response.write(line.encode())
        await response.write_eof()
    except ConnectionResetError:  # the client went away (a browser closed the page): done
        pass
    return response


NON_EMPTY = "model must be a non-empty string"


async def _body_name(request: web.Request) -> str:
    """llama.cpp's ``json_value(body, "model", "")``: anything but a non-empty string is
    missing; a body that is not JSON is the client's mistake (400, as the app says it)."""
    body = parse_json_body(await read_control_body(request))
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise ApiError(400, NON_EMPTY)
    _only_the_name(body, name)
    return name


def _only_the_name(body: dict[str, Any], name: str) -> None:
    """A model added over HTTP carries its name (``hf-repo``) and nothing else: its options
    come from the node's presets. Whoever may call the API is not the node's administrator,
    so an option is judged as in a restricted preset (``sources.trust``); and since llama.cpp
    reads nothing but ``model`` here, any other field is refused too, never dropped unsaid."""
    extra = sorted(key for key in body if key != "model")
    for key in extra:
        match = llama_options().key(key.lstrip("-"))
        refusal = option_refusal(match.option.name) if match is not None else None
        if refusal is not None:
            raise ApiError(400, f"POST /models cannot set {clip(key)!r}: {refusal}")
    if extra:
        fields = clip(", ".join(repr(clip(key)) for key in extra))
        raise ApiError(
            400,
            f'POST /models takes only "model", not {fields}: a downloaded model\'s options '
            f"come from the node's presets (a [{clip(name)}] section)",
        )


async def post_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    name = await _body_name(request)
    registry = state.registry
    await registry.downloads.start_repo(name, exists=lambda n: registry.resolve(n) is not None)
    return web.json_response({"success": True})


async def delete_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    registry = state.registry
    name = request.query.get("model", "")
    if not name:
        raise ApiError(400, NON_EMPTY)
    canonical = registry.resolve(name)
    if canonical is None:
        raise ApiError(500, f"model name={clip(name)} is not found")
    downloading = registry.downloads.active(canonical)
    if not downloading and registry.spec(canonical).source != SOURCE_CACHE:
        raise ApiError(500, f"model name={canonical} is not removable (not from cache)")
    await registry.stop_and_wait(canonical)
    hub = registry.downloads.settings.hub
    if hub is not None:
        try:
            await asyncio.to_thread(hf_hub.remove_cached, hub, canonical)
        except (OSError, ValueError) as exc:
            why = f"model name={canonical}: removing its files failed: {exc}"
            raise ApiError(500, why) from exc
    await state.reload()
    registry.publish(canonical, "model_remove", None)
    return web.json_response({"success": True})


def download_entries(state: AgentState, now: int) -> list[dict[str, Any]]:
    """``GET /models`` entries for downloads of models not in the catalog yet (b11434's)."""
    registry = state.registry
    names = [n for n in registry.downloads.names() if n not in registry.specs()]
    if not names:
        return []  # (pydantic, 8 MiB, only for an agent that downloads)
    from node_agent.models_schema import ModelEntry, ModelStatus, dump  # pydantic: lazily

    entries = []
    for name in names:  # (a preset's own download: its entry says "downloading" itself)
        args = [state.binary, "--host", CHILD_HOST, "--port", "0", "--alias", name]
        entry = ModelEntry(
            id=name,
            aliases=[],
            tags=[],
            object="model",
            owned_by="llamacpp",
            created=now,
            status=ModelStatus(value="downloading", args=args),
            architecture={"input_modalities": ["text"], "output_modalities": ["text"]},
            source=SOURCE_CACHE,
            can_remove=True,
        )
        entries.append(dump(entry))
    return entries


# The model's ring, made on first use (so ``follow`` works before the model's first load).
LOGS: web.AppKey[LogsFor] = web.AppKey("corral_logs")
DEFAULT_LINES = 200


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes", "on")


async def model_logs(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    given = request.query.get("model")
    if not given:
        raise ApiError(400, "model name is missing from the request")
    name = registry.resolve(given)
    if name is None:
        raise ApiError(400, f"model '{clip(given)}' not found")
    try:
        lines = int(request.query.get("lines", DEFAULT_LINES))
    except ValueError:
        raise ApiError(400, "lines must be a whole number") from None
    if lines < 0:
        raise ApiError(400, "lines must be a whole number")
    ring = request.app[LOGS](name)
    backlog = ring.tail(lines) if lines else []
    if not _flag(request, "follow"):
        text = "".join(line + "\n" for line in backlog)
        return web.Response(text=text, content_type="text/plain")
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    for line in backlog:
        await response.write(line.encode() + b"\n")
    async for line in until_shutdown(request.app, ring.follow(backlog=0)):
        await response.write(line.encode() + b"\n")
    await response.write_eof()
    return response


def setup_models_routes(app: web.Application, logs_for: LogsFor | None) -> None:
    app[LISTING] = _SharedListing()
    app.add_routes(
        [
            web.get("/models", list_models),
            web.get("/v1/models", list_models),
            web.get("/v1/models/{model:.+}", retrieve_model),
            web.post("/models/load", load_model),
            web.post("/models/unload", unload_model),
            web.get("/models/sse", models_sse),
            web.post("/models", post_models),
            web.delete("/models", delete_models),
        ]
    )
    if logs_for is not None:
        app[LOGS] = logs_for
        app.router.add_get("/models/logs", model_logs)
