"""The agent's HTTP API: llama.cpp's router endpoints, answered the way it answers them.

Handlers stay thin: they find the model name, ask the registry for a lease, and hand the
request to the proxy. Differences from llama.cpp's router are deliberate and few (each has a
test in ``tests/integration/test_compat.py``):

* a body that is not valid JSON (or is empty, or nests too deeply) is the client's mistake: 400
  with the parser's message (the pinned llama.cpp answers 500; b11434 400, as we do);
* ``/models/load`` for an unknown or missing model says ``model 'X' not found`` or
  ``model name is missing from the request`` (llama.cpp answers the same 404 with
  "File Not Found", which does not say what is missing);
* ``--api-key`` guards ``/models`` and ``/v1/models`` too (the pinned llama.cpp leaves them
  public; b11434 does not): only ``/health`` answers without a key (SPEC, "HTTP API");
* what browsers may do (a Host check, no cross-site simple POSTs): ``browser_guard.py``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from aiohttp import web

from node_agent.api.bodies import (
    CLIENT_TIMEOUT,
    MODEL_MISSING,
    body_model,
    end_worker,
    json_document,
    read_body,
)
from node_agent.api.bodies import parse_json_body as parse_json_body  # routes elsewhere use it
from node_agent.api.browser_guard import cors_headers, guard_middleware
from node_agent.api.chat_ui import serve_chat_ui, setup_chat_ui
from node_agent.api.conversations import (
    CONVERSATIONS,
    HEADER,
    conversation_id,
    setup_conversations,
)
from node_agent.api.form_fields import MULTIPART, multipart_fields
from node_agent.api.long_lived import setup_long_lived
from node_agent.api.metrics import setup_metrics
from node_agent.api.missing_endpoint import NOT_FOUND, endpoint_missing, route_of
from node_agent.api.models_routes import setup_models_routes
from node_agent.api.peer_view import setup_peer_view
from node_agent.api.replies import error_response, json_reply
from node_agent.api.request_record import Exchange, begin_exchange
from node_agent.api.state import PROXIED_GET, PROXIED_POST, STATE, AgentState, RouterSettings
from node_agent.api.tenants import TENANT, request_tenant
from node_agent.api.tools_api import setup_tools
from node_agent.api.ui import setup_ui
from node_agent.api.vertex import setup_vertex
from node_agent.api.views import router_props
from node_agent.clip import clip
from node_agent.core.scheduler_events import Keep, KeepAliveValue, Lease
from node_agent.core.warm_book import tenant_of
from node_agent.errors import ApiError
from node_agent.runtime.model_run import FAKE_TIMING_SECONDS
from node_agent.runtime.registry import Registry
from node_agent.runtime.ttl import parse_keep_alive

log = logging.getLogger("corral.http")

# Routes that answer without an API key (llama.cpp: /health is for load balancers' probes).
# The status page is static and holds no data (it asks for the key itself).
PUBLIC = frozenset({"/health", "/v1/health", "/livez", "/", "/ui", "/ui/"})

# llama.cpp reads request lines and headers of up to ~32 KiB (a long ``?model=`` name gets its
# JSON "not found"); aiohttp's default of 8 KiB would answer those with a plain-text 400.
MAX_LINE_BYTES = 32 * 1024
REALTIME = "/v1/realtime"
SLOT_ACTIONS_OFF = "This server does not support slots action. Start it with `--slot-save-path`"


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPNotFound:
        return json_reply(NOT_FOUND, 404)
    except web.HTTPMethodNotAllowed:
        return json_reply(NOT_FOUND, 404)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(ApiError(413, f"request body too large: {exc.text}"))
    except (asyncio.CancelledError, web.HTTPException):
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, clip(request.path))
        return error_response(ApiError(500, "internal error in the agent (see its log)"))


def given_api_key(headers: Mapping[str, str]) -> str:
    """The key a request offers, read the way llama.cpp reads it.

    ``Authorization`` wins even when it is wrong and ``X-Api-Key`` (Anthropic clients' header)
    is right; a leading ``Bearer `` is dropped from either, and a bare key is accepted too.
    """
    key = headers.get("Authorization", "") or headers.get("X-Api-Key", "")
    return key.removeprefix("Bearer ")


def matching_key(given: str, keys: tuple[str, ...]) -> str | None:
    """The key ``given`` is, if any: compared with every key in constant time, so timing
    does not tell how much matched, or which."""
    offered = given.encode()
    found = None
    for key in keys:
        if hmac.compare_digest(offered, key.encode()):
            found = key
    return found


def key_matches(given: str, keys: tuple[str, ...]) -> bool:
    return matching_key(given, keys) is not None


def auth_middleware(keys: tuple[str, ...], metrics_keys: tuple[str, ...] = ()) -> Any:
    """The API key for everything but the public routes; a metrics key for GET /metrics."""

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path not in PUBLIC:
            given = given_api_key(request.headers)
            # The agent's own figures only: /metrics?model=X asks (and may load) a model.
            scrape = (
                request.path == "/metrics"
                and request.method == "GET"
                and "model" not in request.query
            )
            key = matching_key(given, keys)
            if key is not None:
                request[TENANT] = tenant_of(key)
            elif not (scrape and key_matches(given, metrics_keys)):
                raise ApiError(401, "Invalid API Key")
        return await handler(request)

    return check


def _autoload(request: web.Request, settings: RouterSettings) -> bool:
    """``?autoload=``: llama.cpp takes exactly ``true`` or ``1`` as yes, anything else as no,
    and an empty or absent value as the router's default."""
    value = request.query.get("autoload", "")
    if not value:
        return settings.models_autoload
    return value in ("true", "1")


def _canonical(registry: Registry, name: str | None) -> str:
    if not name:
        raise ApiError(400, MODEL_MISSING)
    canonical = registry.resolve(name)
    if canonical is None:
        raise ApiError(400, f"model '{clip(name)}' not found")
    return canonical


async def proxy_post(request: web.Request) -> web.StreamResponse:
    return await post_body(request, await read_body(request))


async def post_body(
    request: web.Request, body: bytes, *, buffered: bool = False
) -> web.StreamResponse:
    """A model endpoint's POST with its ``body`` read; ``buffered``: the answer in one piece,
    never streamed (for an answer that goes inside another, as Vertex's predictions)."""
    if request.headers.get(HEADER):
        # Shielded from its client's drop from here on: a large body (a chat with an image)
        # is parsed off the loop, and a drop meanwhile would cancel it (Conversations.shielded).
        conversations = request.app[CONVERSATIONS]
        return await conversations.shielded(_post_body(request, body, buffered), "conversation")
    return await _post_body(request, body, buffered)


async def _post_body(request: web.Request, body: bytes, buffered: bool) -> web.StreamResponse:
    state = request.app[STATE]
    if request.content_type == MULTIPART:  # an audio upload: the model is a form field
        data: Any = multipart_fields(request.headers.get("Content-Type", ""), body)
    else:
        data = await json_document(body)
    name = _canonical(state.registry, body_model(data) or None)
    if request.path.startswith("/slots/") and state.registry.warm_owns(name):
        # The slot files are the agent's own (warm swaps): a client may not write, read or
        # erase them; it sees what a child without --slot-save-path answers.
        raise ApiError(501, SLOT_ACTIONS_OFF)
    keep_alive: KeepAliveValue = Keep.DEFAULT
    if isinstance(data, dict) and "keep_alive" in data:
        # Ollama's per-request keep_alive: how long the model stays once idle after it.
        keep_alive = parse_keep_alive(data["keep_alive"])
    if state.peers is not None and not buffered:  # (a Vertex prediction is answered here)
        choice = state.peers.choose(name, request)
        if choice.peer is not None:  # one hop to where the model is (api/peers.py)
            log.debug("model=%s goes to %s: %s", name, choice.peer, choice.why)
            return await state.peers.forward(request, choice.peer, body)
    conv_id = conversation_id(request)
    if conv_id:
        send = partial(_send, request, state, name, body, buffered=buffered)
        autoload = _autoload(request, state.settings)
        conversations = request.app[CONVERSATIONS]
        return await conversations.proxy(
            request, name, conv_id, autoload=autoload, send=send, keep_alive=keep_alive
        )
    return await _proxy(
        request, state, name, body, inference=True, buffered=buffered, keep_alive=keep_alive
    )


async def proxy_get(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    name = _canonical(state.registry, request.query.get("model"))
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _websocket(request, state, name)
    return await _proxy(request, state, name, None, inference=False)


async def _websocket(request: web.Request, state: AgentState, name: str) -> web.StreamResponse:
    """A WebSocket session (``/v1/realtime?model=``): the model is leased for its whole
    life, as a use (it makes the model younger), without one of the child's slots."""
    autoload = _autoload(request, state.settings)
    lease = await state.registry.acquire(
        name, autoload=autoload, inference=True, slot=False, tenant=request_tenant(request)
    )
    try:
        if lease.port is None:
            raise ApiError(500, f"model name={name} is not running")
        return await state.proxy.websocket(request, lease.port)
    finally:
        state.registry.release(lease)


async def _proxy(
    request: web.Request,
    state: AgentState,
    name: str,
    body: bytes | None,
    *,
    inference: bool,
    buffered: bool = False,
    keep_alive: KeepAliveValue = Keep.DEFAULT,
) -> web.StreamResponse:
    exchange = begin_exchange(request, name)
    lease = await state.registry.acquire(
        name,
        autoload=_autoload(request, state.settings),
        inference=inference,
        keep_alive=keep_alive,
        tenant=request_tenant(request),
    )
    exchange.leased()
    return await _send(request, state, name, body, lease, exchange, False, buffered=buffered)


async def _send(
    request: web.Request,
    state: AgentState,
    name: str,
    body: bytes | None,
    lease: Lease,
    exchange: Exchange,
    detached: bool,
    *,
    buffered: bool = False,
) -> web.StreamResponse:
    """Send a leased request to its child, then give the lease back (``detached`` and
    ``buffered``: see :meth:`Proxy.forward`)."""
    try:
        if state.registry.fake_timing:
            await asyncio.sleep(FAKE_TIMING_SECONDS)
        if lease.port is None:
            raise ApiError(500, f"model name={name} is not running")
        response = await state.proxy.forward(
            request, lease.port, body, exchange, buffered=buffered, detached=detached
        )
    finally:
        state.registry.release(lease, exchange.child_fault)
    missing = endpoint_missing(
        response, request.method, route_of(request), state.settings.build_info, state.binary
    )
    if missing is not None:
        raise missing
    return response


async def props(request: web.Request) -> web.StreamResponse:
    # llama.cpp: ``/props?model=`` (empty) is the router's own props, like no ``model`` at all.
    if request.query.get("model"):
        return await proxy_get(request)
    state = request.app[STATE]
    return json_reply(router_props(state.settings))


async def health(request: web.Request) -> web.StreamResponse:
    """llama.cpp's readiness answer (its own is 503 while a model loads): Corral's is 503
    while the agent cannot serve as it was told to (``--expect-gpus``)."""
    why = request.app[STATE].settings.unready
    if why is not None:
        error = {"code": 503, "message": why, "type": "unavailable_error"}
        return json_reply({"error": error}, 503)
    return json_reply({"status": "ok"})


async def livez(request: web.Request) -> web.StreamResponse:
    """Corral: the agent runs and its loop answers (a liveness probe's question, apart from
    readiness: a pod without its GPUs is not ready, and restarting it would not help)."""
    return json_reply({"status": "ok"})


async def ledger(request: web.Request) -> web.StreamResponse:
    """Corral: the whole memory ledger, per device (total, external, held, available)."""
    memory = request.app[STATE].registry.memory
    if memory is None:
        raise ApiError(
            404, "the memory ledger is off: start the agent with --models-memory-margin MiB"
        )
    stats = memory.statistics()
    # A fresh reading for the one who asks; peers poll each second with ?probe=0 and get the
    # last one (loads and unloads count at once: ``held`` needs no reading), unless there has
    # been none yet (a device with no total).
    if request.query.get("probe") != "0" or any(d["total"] is None for d in stats["devices"]):
        memory.refresh()
        stats = memory.statistics()
    return json_reply(stats)


def build_app(state: AgentState) -> web.Application:
    browser = state.settings.browser
    guard = guard_middleware(browser, loading_gets=frozenset(PROXIED_GET))
    middlewares: list[Any] = [errors_middleware, guard, serve_chat_ui]
    if state.settings.api_keys:
        middlewares.append(auth_middleware(state.settings.api_keys, state.settings.metrics_keys))
    app = web.Application(
        middlewares=middlewares,
        client_max_size=state.settings.max_body_bytes,
        handler_args={"max_line_size": MAX_LINE_BYTES, "max_field_size": MAX_LINE_BYTES},
    )
    app[STATE] = state
    app[CLIENT_TIMEOUT] = state.settings.client_timeout
    setup_long_lived(app)
    app.on_response_prepare.append(cors_headers(browser))
    routes = [
        web.get("/health", health),
        web.get("/v1/health", health),
        web.get("/livez", livez),
        web.get("/ledger", ledger),
        web.get("/props", props),
        *(web.post(path, proxy_post) for path in PROXIED_POST),
        *(web.get(path, proxy_get) for path in PROXIED_GET if path != "/props"),
        web.get(REALTIME, proxy_get),  # WebSocket only (llama.cpp's router's proxy_ws)
    ]
    # No catch-all route: unknown paths and methods become llama.cpp's JSON 404 in
    # errors_middleware, so routes added after this (metrics, page, logs) still match.
    app.add_routes(routes)
    if state.settings.vertex is not None:
        setup_vertex(
            app, state.settings.vertex, PROXIED_POST, partial(post_body, buffered=True), health
        )
    setup_metrics(app)
    setup_peer_view(app)
    setup_conversations(app)
    setup_models_routes(app, state.logs_for)
    setup_ui(app)
    setup_chat_ui(app, state.binary)
    setup_tools(app, state.mcp_servers, state.settings.cors_proxy, state.builtin_tools)
    app.on_cleanup.append(_end_body_worker)
    return app


async def _end_body_worker(app: web.Application) -> None:
    end_worker()
