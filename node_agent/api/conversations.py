"""Conversation streams: ``X-Conversation-Id`` requests and ``/v1/stream``, as b11434's router.

A llama-server child (the pinned b10434 and b11434, measured) keeps the generation of a request
that carries ``X-Conversation-Id`` in a session buffer that survives the client, and replays it
on ``GET /v1/stream?conv_id=…&from=N``. The router remembers which model serves which
conversation (:class:`~node_agent.core.conversations.ConversationBook` decides) and:

* proxies a conversation request that had to wait for its model's load *detached*: the client
  that drops meanwhile (a page reload) does not cancel it; it still reaches the child once the
  model is ready and the generation goes on into the session buffer; any conversation
  request reaches its child, even from a client that drops as soon as it has sent it;
* answers ``GET /v1/stream`` from the owning child (503 while its request waits for the load,
  404 when nothing is known), ``POST /v1/streams/lookup`` from the children that own the ids,
  and ``DELETE /v1/stream`` (204) by evicting the child's session, or cancelling the request
  parked behind the load: it ends at once with 400 "request cancelled by a stop while the model
  was loading" (llama.cpp ends it only once the load is over).

Deliberate differences (asserted in ``tests/integration/test_conversations.py``): a stop ends
a parked request at once, not once the load is over; ``GET /v1/stream`` answers 503 for as long
as the request is parked (b11434: only while the child loads, 404 before, e.g. while it waits
for room). The id travels in the query string, so it may hold slashes (``org/repo::chat``).
Every request to a child goes through :meth:`Proxy.forward`, the one place that speaks to children.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from node_agent.aio import TaskSet
from node_agent.api.bodies import read_control_body
from node_agent.api.body_fields import loads
from node_agent.api.request_record import Exchange, begin_exchange
from node_agent.api.state import STATE, AgentState
from node_agent.api.tenants import request_tenant
from node_agent.core.conversations import MAX_ID_CHARS, ConversationBook, StreamRoute, detaches
from node_agent.core.model_state import ModelState
from node_agent.core.scheduler_events import Keep, KeepAliveValue, Lease
from node_agent.errors import ApiError

log = logging.getLogger("corral.conversations")

HEADER = "X-Conversation-Id"
CANCELLED = "request cancelled by a stop while the model was loading"
MISSING_ID = "Missing conversation id in path"
LOADING = "Stream owner model is loading, retry later"
# Lookups and stops ask a child a small JSON question; llama.cpp gives them 250 ms on the
# loopback. Ours allow for a busy machine: a child that does not answer is skipped.
CONTROL_TIMEOUT = 5.0

# What a caller has once its lease is granted: send the request to the leased child
# (``detached``: as :meth:`Proxy.forward` says) and release the lease when done.
Send = Callable[[Lease, Exchange, bool], Awaitable[web.StreamResponse]]


class Conversations:
    """The conversation book, carried out: parked requests' stop signals and detached tasks."""

    def __init__(self, state: AgentState) -> None:
        self._state = state
        self._registry = state.registry
        self.book = ConversationBook()
        self._stops: dict[int, asyncio.Event] = {}  # parked ticket -> set by a stop
        self._tasks = TaskSet("conversations")
        # Whether the binary's children have sessions; None until one was asked.
        self.supported: bool | None = None

    def _cancel(self, tickets: tuple[int, ...]) -> None:
        for ticket in tickets:
            stop = self._stops.get(ticket)
            if stop is not None:
                stop.set()

    def state_of(self, model: str) -> ModelState | None:
        return self._registry.state(model) if model in self._registry.specs() else None

    async def proxy(
        self,
        request: web.Request,
        name: str,
        conv_id: str,
        *,
        autoload: bool,
        send: Send,
        keep_alive: KeepAliveValue = Keep.DEFAULT,
    ) -> web.StreamResponse:
        """A POST for model ``name`` that carries conversation ``conv_id``."""
        remembered = self.book.remember(conv_id, name)
        self._cancel(remembered.cancelled)
        ticket = remembered.ticket
        # Ready: it takes the request now (a model draining for an unload must load again).
        ready = name in self._registry.specs() and self._registry.scheduler.view(name).usable
        exchange = begin_exchange(request, name)
        # Run shielded (``shielded``, from its body's parse on): the request reaches the child
        # even from a client that is gone. Only a detached one reads the answer on without it.
        return await self._serve(
            request, name, conv_id, ticket, exchange,
            autoload=autoload, keep_alive=keep_alive, send=send,
            detached=detaches(ticket, ready),
        )  # fmt: skip

    async def shielded(self, serve: Awaitable[web.StreamResponse], name: str) -> web.StreamResponse:
        """``serve`` (a conversation request, from its body's parse on) in a task of its own,
        which the handler's cancellation (its client went away) leaves going: the request
        reaches the child, whose session keeps the generation, even from a client that dropped
        as soon as it had sent it (b11434's router sends it on from its own thread). Its
        outcome, an ApiError or a gone client's reset, is raised here."""
        task = self._tasks.spawn(_answer(serve), name)
        outcome: web.StreamResponse | ApiError | ConnectionResetError = await asyncio.shield(task)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _serve(
        self,
        request: web.Request,
        name: str,
        conv_id: str,
        ticket: int,
        exchange: Exchange,
        *,
        autoload: bool,
        keep_alive: KeepAliveValue,
        send: Send,
        detached: bool,
    ) -> web.StreamResponse:
        lease = await self._acquire(
            name, conv_id, ticket,
            autoload=autoload, keep_alive=keep_alive, tenant=request_tenant(request),
        )  # fmt: skip
        exchange.leased()
        if not self.book.alive(conv_id, ticket):
            # Replaced by a newer request of the conversation, or stopped, as the lease came.
            self._registry.release(lease)
            log.info("request for conv_id=%s cancelled while model=%s was loading", conv_id, name)
            raise ApiError(400, CANCELLED)
        self.book.sending(ticket, True)
        try:
            return await send(lease, exchange, detached)
        finally:
            self.book.sending(ticket, False)

    async def _acquire(
        self,
        name: str,
        conv_id: str,
        ticket: int,
        *,
        autoload: bool,
        keep_alive: KeepAliveValue,
        tenant: str,
    ) -> Lease:
        """The lease, unless a stop for the conversation comes first (then 400, cancelled)."""
        if not self.book.park(conv_id, ticket):
            raise ApiError(400, CANCELLED)
        stop = self._stops[ticket] = asyncio.Event()
        acquire = asyncio.ensure_future(
            self._registry.acquire(name, autoload=autoload, keep_alive=keep_alive, tenant=tenant)
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._abandon(acquire)  # cancelled (the agent closing): leave the queue
            raise
        finally:
            self.book.unpark(ticket)
            del self._stops[ticket]
            stopped.cancel()
        if acquire.done():
            return acquire.result()  # a stop at the same moment: _serve's alive check sees it
        self._abandon(acquire)
        log.info("request for conv_id=%s cancelled while model=%s loads", conv_id, name)
        raise ApiError(400, CANCELLED)

    def _abandon(self, acquire: asyncio.Future[Lease]) -> None:
        """Give up a lease request: it leaves the queue (a load it started goes on), and a
        lease granted in the same moment is given back."""

        def release(task: asyncio.Future[Lease]) -> None:
            if not task.cancelled() and task.exception() is None:
                self._registry.release(task.result())

        acquire.cancel()
        acquire.add_done_callback(release)

    # -- the stream routes -------------------------------------------------------------------

    def _owner(self, conv_id: str) -> str:
        """The model whose child holds ``conv_id``'s session, or the route's error."""
        route = self.book.route(conv_id, self.state_of)
        if route is StreamRoute.RETRY:
            raise ApiError(503, LOADING)
        if route is StreamRoute.NOT_FOUND:
            # b11434 means "Stream not found or expired", but its HTTP layer answers every 404
            # with this body (measured: its router and its children alike).
            raise ApiError(404, "File Not Found")
        owner = self.book.owner(conv_id)
        assert owner is not None
        return owner

    def _port(self, name: str) -> int | None:
        child = self._registry.child(name)
        return child.port if child is not None else None

    async def stream(self, request: web.Request) -> web.StreamResponse:
        conv_id = _conv_id(request)
        owner = self._owner(conv_id)
        # A lease keeps the child from being evicted while its replay is read; the replay takes
        # no slot of the child, so it waits for none.
        lease = await self._registry.acquire(owner, autoload=False, inference=False, slot=False)
        try:
            port = lease.port
            if port is None:
                raise ApiError(503, LOADING)
            response = await self._state.proxy.forward(request, port, None)
            if response.status == 404 and not response.prepared:
                await self._check_support(request, owner, port)
                if self.book.after_miss(conv_id) is StreamRoute.RETRY:
                    raise ApiError(503, LOADING)
            self._learn(response.status)
            return response
        finally:
            self._registry.release(lease)

    async def _check_support(self, request: web.Request, owner: str, port: int) -> None:
        """A 404 from the child: its session is gone, or its binary has no sessions at all."""
        await self._probe(request, owner, port)
        if not self.supported:
            raise ApiError(
                501,
                f"the llama-server of model '{owner}' ({self._state.binary}) has no "
                "conversation streams (X-Conversation-Id, /v1/stream): use a llama-server "
                "that has them (b10434 and b11434 do, see docs/conversations.md)",
            )

    async def _probe(self, request: web.Request, owner: str, port: int) -> None:
        """Ask the child whether it keeps sessions at all: one that does answers
        ``GET /v1/stream`` without an id with 400, one that does not has no such route (404)."""
        if self.supported is not None:
            return
        probe = request.clone(rel_url="/v1/stream")  # a GET that has read no body
        answer = await self._state.proxy.forward(probe, port, None)
        self._learn(answer.status)

    def _learn(self, status: int) -> None:
        """What a child's answer to a stream route says of its binary (``GET /models`` shows
        it): a route it has answers 2xx or 400, one it lacks 404 (the stream GET's own 404 is
        settled by :meth:`_probe`)."""
        if self.supported is not None or status not in (200, 204, 400, 404):
            return
        self.supported = status != 404
        log.info("%s has conversation streams: %s", self._state.binary, self.supported)

    async def lookup(self, request: web.Request) -> web.StreamResponse:
        error, data = loads(await read_control_body(request))
        if error is not None:
            return web.json_response([])  # llama.cpp's router: an empty list
        ids = data.get("conversation_ids") if isinstance(data, dict) else None
        per_model: dict[str, list[str]] = {}
        for conv_id in ids if isinstance(ids, list) else ():
            if not isinstance(conv_id, str) or not conv_id or len(conv_id) > MAX_ID_CHARS:
                continue  # no such conversation is kept
            owner = self.book.owner(conv_id)
            if owner is not None and self.book.route(conv_id, self.state_of) is StreamRoute.PROXY:
                per_model.setdefault(owner, []).append(conv_id)
        found: list[Any] = []
        for owner, owned in per_model.items():
            body = json.dumps({"conversation_ids": owned}).encode()
            answer = await self._ask(request, owner, body)
            if answer is not None:
                self._learn(answer.status)
            if answer is not None and answer.status == 200:
                try:
                    entries = json.loads(answer.body)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    continue
                if isinstance(entries, list):
                    found.extend(e for e in entries if isinstance(e, dict))
        return web.json_response(found)

    async def stop(self, request: web.Request) -> web.StreamResponse:
        conv_id = _conv_id(request)
        route = self.book.route(conv_id, self.state_of)
        owner = self.book.owner(conv_id)
        if route is StreamRoute.PROXY and owner is not None:
            answer = await self._ask(request, owner, None)  # idempotent on the child
            if answer is not None:
                self._learn(answer.status)
        elif owner is not None:
            log.info("stop for conv_id=%s while model=%s loads: cancelling", conv_id, owner)
        else:
            log.warning("stop for unknown conv_id=%s", conv_id)
        self._cancel(self.book.forget(conv_id))
        return web.Response(status=204, content_type="application/json")

    async def _ask(
        self, request: web.Request, owner: str, body: bytes | None
    ) -> web.Response | None:
        """Forward a small control request (lookup, stop) to ``owner``'s child, without a
        lease or a slot (a stop must not queue behind the generations it stops); None when
        the child is gone or does not answer in time."""
        port = self._port(owner)
        if port is None:
            return None
        try:
            answer = await asyncio.wait_for(
                self._state.proxy.forward(request, port, body),
                CONTROL_TIMEOUT,
            )
        except (ApiError, TimeoutError) as exc:
            log.warning("model=%s did not answer %s: %s", owner, request.path, exc)
            return None
        return answer if isinstance(answer, web.Response) else None

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        yield
        await self._tasks.close()


async def _answer(
    serve: Awaitable[web.StreamResponse],
) -> web.StreamResponse | ApiError | ConnectionResetError:
    """A shielded request's outcome. An ApiError, or the reset of a client that went away
    before its answer began, is returned (the client may be gone, and nobody else would read
    it); anything else is the task set's to log."""
    try:
        return await serve
    except (ApiError, ConnectionResetError) as exc:
        return exc


def _conv_id(request: web.Request) -> str:
    conv_id = request.query.get("conv_id", "")
    if not conv_id:
        raise ApiError(400, MISSING_ID)
    return _bounded(conv_id)


def _bounded(conv_id: str) -> str:
    """``conv_id``, refused when longer than any conversation id the book keeps."""
    if len(conv_id) > MAX_ID_CHARS:
        raise ApiError(
            400,
            f"conversation id too long: {len(conv_id)} characters, at most {MAX_ID_CHARS}",
        )
    return conv_id


CONVERSATIONS: web.AppKey[Conversations] = web.AppKey("corral_conversations", Conversations)


def conversation_id(request: web.Request) -> str:
    """The request's ``X-Conversation-Id`` (header names are case-insensitive), or ""."""
    return _bounded(request.headers.get(HEADER, ""))


def setup_conversations(app: web.Application) -> None:
    """Add the stream routes and the conversation book (call from build_app)."""
    conversations = app[CONVERSATIONS] = Conversations(app[STATE])

    async def stream(request: web.Request) -> web.StreamResponse:
        return await conversations.stream(request)

    async def lookup(request: web.Request) -> web.StreamResponse:
        return await conversations.lookup(request)

    async def stop(request: web.Request) -> web.StreamResponse:
        return await conversations.stop(request)

    app.router.add_get("/v1/stream", stream)
    app.router.add_post("/v1/streams/lookup", lookup)
    app.router.add_delete("/v1/stream", stop)
    app.cleanup_ctx.append(conversations.lifecycle)
