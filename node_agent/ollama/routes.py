"""Ollama's API on the agent's port: the routes, their bodies, and Ollama's error shape.

Ollama's clients read an error as ``{"error": "text"}`` (the ``ollama`` Python client raises
``ResponseError`` with that text and the status); the agent's middleware still guards these
routes (``--api-key``, the browser's rules) like every other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from node_agent.api.bodies import parse_json_body, read_control_body
from node_agent.api.models_routes import delete_models
from node_agent.api.state import STATE
from node_agent.errors import ApiError
from node_agent.ollama import listing
from node_agent.ollama.generation import child_session, serve
from node_agent.ollama.pull import pull
from node_agent.ollama.translate import chat_request, embed_request, generate_request, model_name

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _ollama_errors(handler: Handler) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return web.json_response({"error": exc.message}, status=exc.status, headers=exc.headers)

    return answer


def _with_body(handler: BodyHandler) -> Handler:
    """The request's JSON object (at most 1 MiB: these bodies are text and settings; a larger
    one is refused with 413 before it is read whole), then ``handler``."""

    async def read(request: web.Request) -> web.StreamResponse:
        body = parse_json_body(await read_control_body(request))
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return await handler(request, body)

    return _ollama_errors(read)


async def _chat(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return await serve(request, body, chat_request)


async def _generate(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return await serve(request, body, generate_request)


async def _embed(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return await serve(request, body, embed_request)


async def _embeddings(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """The older ``/api/embeddings`` (``prompt`` in, ``embedding`` out)."""
    if "input" in body:
        raise ApiError(400, "/api/embeddings takes prompt; /api/embed takes input")
    legacy = {**body, "input": body.get("prompt")}
    legacy.pop("prompt", None)
    answer = await serve(request, legacy, embed_request)
    assert isinstance(answer, web.Response) and answer.text is not None
    embeddings = parse_json_body(answer.text.encode()).get("embeddings") or [[]]
    return web.json_response({"embedding": embeddings[0]})


async def _show(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response(await listing.show(request, body))


async def _delete(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """``DELETE /api/delete``: ``DELETE /models?model=`` (a downloaded model and its files)."""
    name = listing.resolve(request.app[STATE].registry, model_name(body))
    await delete_models(request.clone(rel_url=request.rel_url.with_query(model=name)))
    return web.Response()  # Ollama answers an empty 200


def _not_mapped(what: str) -> Handler:
    async def refuse(request: web.Request) -> web.StreamResponse:
        raise ApiError(501, f"{request.path} is not supported by Corral: {what}")

    return _ollama_errors(refuse)


# Ollama's routes that make or move models in its own store, which Corral does not have:
# a clear 501 rather than llama.cpp's "File Not Found".
NOT_MAPPED = {
    "/api/create": "models come from --models-dir, presets and Hugging Face (corral pull)",
    "/api/copy": "give a model another name with alias = NAME in its preset",
    "/api/push": "Corral does not publish models",
}


def setup_ollama(app: web.Application) -> None:
    """Add Ollama's routes (and the session they reach children with) to the agent's app."""
    app.cleanup_ctx.append(child_session)
    app.add_routes(
        [
            web.get("/api/version", _ollama_errors(listing.version)),
            web.get("/api/tags", _ollama_errors(listing.tags)),
            web.get("/api/ps", _ollama_errors(listing.ps)),
            web.post("/api/show", _with_body(_show)),
            web.post("/api/chat", _with_body(_chat)),
            web.post("/api/generate", _with_body(_generate)),
            web.post("/api/embed", _with_body(_embed)),
            web.post("/api/embeddings", _with_body(_embeddings)),
            web.post("/api/pull", _with_body(pull)),
            web.delete("/api/delete", _with_body(_delete)),
            *(web.post(path, _not_mapped(what)) for path, what in NOT_MAPPED.items()),
        ]
    )
