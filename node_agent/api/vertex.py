"""Google Cloud Vertex AI's prediction protocol, as llama.cpp b11434 serves it (server-http.cpp,
``register_gcp_compat``): on when ``AIP_MODE=PREDICTION``.

``AIP_HTTP_PORT`` (default 8080) replaces ``--port``; ``AIP_HEALTH_ROUTE`` serves ``/health``
under another path; ``POST AIP_PREDICT_ROUTE`` (default ``/predict``) takes
``{"instances": [...]}`` and answers ``{"predictions": [...]}``, one per instance, in order.
Each instance names its endpoint in ``@requestFormat``: a path (``/v1/embeddings``) or its
camelCase alias (``chatCompletions``), and carries that endpoint's body (its ``model`` is looked
up as for any request; ``stream`` is forced off). An instance that fails gets its error object
in its place; the others still run.

Deliberate differences (docs/compatibility.md): b11434's router answers every instance that
reaches a model with "predict route does not support streaming responses" (its proxy is a
stream), and its children inherit ``AIP_MODE`` and try to listen on the router's port, so no
model loads; Corral answers the model's response. Only the model endpoints (POST) are
dispatched; where two paths share an alias, the ``/v1`` one wins (llama.cpp's pick is its hash
map's order).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from yarl import URL

from node_agent.api.bodies import digest, read_body
from node_agent.api.vertex_instances import Instance, split_instances
from node_agent.errors import ApiError, ConfigError

log = logging.getLogger("corral.http")

Dispatch = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Vertex:
    port: int
    predict_route: str = "/predict"
    health_route: str = ""


def _route(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name) or default
    return value if not value or value.startswith("/") else "/" + value


def vertex_from_env(env: Mapping[str, str]) -> Vertex | None:
    """Vertex's settings where ``AIP_MODE=PREDICTION``, else None."""
    if env.get("AIP_MODE") != "PREDICTION":
        return None
    raw = env.get("AIP_HTTP_PORT") or "8080"
    try:
        port = int(raw)
    except ValueError as exc:
        raise ConfigError(f"AIP_HTTP_PORT={raw!r} is not a port number") from exc
    return Vertex(
        port=port,
        predict_route=_route(env, "AIP_PREDICT_ROUTE", "/predict"),
        health_route=_route(env, "AIP_HEALTH_ROUTE", ""),
    )


def request_format(path: str) -> str:
    """A path's camelCase alias: ``/v1/chat/completions`` → ``chatCompletions``."""
    text = path.removeprefix("/v1") if len(path) > 3 else path
    text = text.removeprefix("/")
    out: list[str] = []
    upper = False
    for char in text:
        if char in ":{":
            break  # path parameters are not part of it
        if char in "/-_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)


def _aliases(paths: Iterable[str]) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for path in paths:
        alias = request_format(path)
        if alias not in aliases or path.startswith("/v1/"):
            aliases[alias] = path
    return aliases


def _error(status: int, message: str) -> dict[str, Any]:
    return ApiError(status, message).body()


def _prediction(response: web.StreamResponse) -> Any:
    if not isinstance(response, web.Response):
        return _error(400, "predict route does not support streaming responses")
    body = response.body
    if not body:
        return None
    if not isinstance(body, bytes):
        return _error(500, "the model's answer could not be read")
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


def setup_vertex(
    app: web.Application, vertex: Vertex, posts: Iterable[str], dispatch: Dispatch, health: Any
) -> None:
    """Add Vertex's routes (after every other route: its predict route must be new)."""
    taken = {resource.canonical for resource in app.router.resources()}
    if vertex.predict_route in taken:
        raise ConfigError(
            f"AIP_PREDICT_ROUTE={vertex.predict_route} conflicts with an existing route"
        )
    posts = tuple(posts)
    aliases = _aliases(posts)
    direct = frozenset(p for p in posts if "{" not in p)

    async def one(unread: web.Request, instance: Instance | str) -> Any:
        if isinstance(instance, str):
            return _error(400, instance)
        if instance.had_stream:
            log.warning("ignoring an instance's stream field: the predict route does not stream")
        form = instance.form
        path = aliases.get(form) or (form if form in direct else None)
        if path is None:
            return _error(400, f"no handler registered for @requestFormat: {form}")
        inner = unread.clone(rel_url=URL.build(path=path, query=unread.query))
        try:
            return _prediction(await dispatch(inner, instance.body))
        except ApiError as exc:
            return exc.body()

    async def predict(request: web.Request) -> web.StreamResponse:
        # aiohttp clones only a request whose body is unread: one copy kept for the instances.
        unread = request.clone()
        # As every body: within --client-timeout, and parsed off the loop when large.
        instances = await digest(await read_body(request), split_instances)
        predictions = await asyncio.gather(*(one(unread, i) for i in instances))
        body = json.dumps({"predictions": predictions}, separators=(",", ":")).encode()
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    app.router.add_post(vertex.predict_route, predict)
    if vertex.health_route and vertex.health_route not in taken:
        app.router.add_get(vertex.health_route, health)
