"""The agent's HTTP API: llama.cpp's router endpoints, answered the way it answers them.

Handlers stay thin: they find the model name, ask the registry for a lease, and hand the
request to the proxy. Differences from llama.cpp's router are deliberate and few (each has a
test in ``tests/integration/test_compat.py``):

* a body that is not valid JSON is the client's mistake: 400 with the parser's message (llama.cpp
  answers 500);
* ``/models/load`` and ``/models/unload`` for an unknown model say ``model 'X' not found``
  (llama.cpp answers 404 "File Not Found", the same status without saying what is missing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from node_agent.errors import ApiError
from node_agent.router.proxy import Proxy
from node_agent.router.registry import FAKE_TIMING_SECONDS, Registry
from node_agent.router.views import model_entry, router_props

log = logging.getLogger(__name__)

# Endpoints whose POST body names the model (llama.cpp's proxy_post routes).
PROXIED_POST = (
    "/completion",
    "/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/infill",
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
    "/tokenize",
    "/detokenize",
    "/apply-template",
)
# GET endpoints that name the model in ``?model=`` (they do not make a model younger).
PROXIED_GET = ("/props", "/metrics", "/slots")

# Routes that answer without an API key (llama.cpp: /health is for load balancers' probes).
PUBLIC = frozenset({"/health", "/v1/health"})

NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


@dataclass(frozen=True)
class RouterSettings:
    """What the HTTP layer needs of the agent's options."""

    models_max: int
    models_autoload: bool
    api_keys: tuple[str, ...]
    build_info: str
    max_body_bytes: int = 64 * 1024 * 1024


Reloader = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class AgentState:
    registry: Registry
    proxy: Proxy
    settings: RouterSettings
    reload: Reloader
    binary: str


STATE: web.AppKey[AgentState] = web.AppKey("corral_state", AgentState)


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(),
        content_type="application/json",
        headers=headers,
    )


def error_response(error: ApiError) -> web.Response:
    return _json(error.body(), error.status, error.headers)


@web.middleware
async def errors_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPNotFound:
        return _json(NOT_FOUND, 404)
    except web.HTTPMethodNotAllowed:
        return _json(NOT_FOUND, 404)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(ApiError(413, f"request body too large: {exc.text}"))
    except (asyncio.CancelledError, web.HTTPException):
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal error in the agent (see its log)"))


def auth_middleware(keys: tuple[str, ...]) -> Any:
    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path not in PUBLIC and request.method != "OPTIONS":
            given = request.headers.get("Authorization", "")
            token = (
                given[7:] if given.startswith("Bearer ") else request.headers.get("X-Api-Key", "")
            )
            if token not in keys:
                raise ApiError(401, "Invalid API Key")
        return await handler(request)

    return check


def _autoload(request: web.Request, settings: RouterSettings) -> bool:
    value = request.query.get("autoload")
    if value is None:
        return settings.models_autoload
    return value.lower() in ("1", "true", "yes", "on")


def _canonical(registry: Registry, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model name is missing from the request")
    canonical = registry.resolve(name)
    if canonical is None:
        raise ApiError(400, f"model '{name}' not found")
    return canonical


async def _read_json(request: web.Request) -> tuple[bytes, Any]:
    body = await request.read()
    try:
        return body, json.loads(body) if body else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc


async def proxy_post(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body, data = await _read_json(request)
    model = data.get("model") if isinstance(data, dict) else None
    name = _canonical(state.registry, model)
    return await _proxy(request, state, name, body, inference=True)


async def proxy_get(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    name = _canonical(state.registry, request.query.get("model"))
    return await _proxy(request, state, name, None, inference=False)


async def _proxy(
    request: web.Request, state: AgentState, name: str, body: bytes | None, *, inference: bool
) -> web.StreamResponse:
    lease = await state.registry.acquire(
        name, autoload=_autoload(request, state.settings), inference=inference
    )
    try:
        if state.registry.fake_timing:
            await asyncio.sleep(FAKE_TIMING_SECONDS)
        return await state.proxy.forward(request, state.registry.port(lease), body)
    finally:
        state.registry.release(lease)


async def props(request: web.Request) -> web.StreamResponse:
    if "model" in request.query:
        return await proxy_get(request)
    state = request.app[STATE]
    return _json(router_props(state.settings))


async def health(request: web.Request) -> web.StreamResponse:
    return _json({"status": "ok"})


async def list_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if request.query.get("reload", "").lower() in ("1", "true", "yes", "on"):
        await state.reload()
    registry = state.registry
    now = int(time.time())
    data = [model_entry(registry, name, state.binary, now) for name in registry.specs()]
    return _json({"data": data, "object": "list"})


async def _model_from_body(request: web.Request, registry: Registry) -> str:
    _, data = await _read_json(request)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model name is missing from the request")
    canonical = registry.resolve(model)
    if canonical is None:
        raise ApiError(404, f"model '{model}' not found")
    return canonical


async def load_model(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    await registry.load(await _model_from_body(request, registry))
    return _json({"success": True})


async def unload_model(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    await registry.unload(await _model_from_body(request, registry))
    return _json({"success": True})


async def models_sse(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    async for event in registry.events():
        message: dict[str, Any] = {"model": event.model, "event": event.event}
        if event.data is not None:
            message["data"] = event.data
        await response.write(f"data: {json.dumps(message, separators=(',', ':'))}\n\n".encode())
    return response


async def ledger(request: web.Request) -> web.StreamResponse:
    """Corral: the whole memory ledger, per device (total, external, held, available)."""
    memory = request.app[STATE].registry.memory
    if memory is None:
        raise ApiError(
            404, "the memory ledger is off: start the agent with --models-memory-margin MiB"
        )
    return _json(memory.statistics())


async def not_found(request: web.Request) -> web.StreamResponse:
    return _json(NOT_FOUND, 404)


def build_app(state: AgentState) -> web.Application:
    middlewares: list[Any] = [errors_middleware]
    if state.settings.api_keys:
        middlewares.append(auth_middleware(state.settings.api_keys))
    app = web.Application(middlewares=middlewares, client_max_size=state.settings.max_body_bytes)
    app[STATE] = state
    routes = [
        web.get("/health", health),
        web.get("/v1/health", health),
        web.get("/models", list_models),
        web.get("/v1/models", list_models),
        web.post("/models/load", load_model),
        web.post("/models/unload", unload_model),
        web.get("/models/sse", models_sse),
        web.get("/ledger", ledger),
        web.get("/props", props),
        *(web.post(path, proxy_post) for path in PROXIED_POST),
        *(web.get(path, proxy_get) for path in PROXIED_GET if path != "/props"),
        web.route("*", "/{tail:.*}", not_found),
    ]
    app.add_routes(routes)
    return app
