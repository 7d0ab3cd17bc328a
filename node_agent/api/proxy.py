"""Forward one HTTP request to a child llama-server (or a peer agent) and pass its answer back.

Bodies with a known length are answered in one piece; everything else (server-sent events,
chunked bodies) is passed through read by read as the child writes it, never buffered, and
with no task woken per event (``api/wire.py``).

A request comes here with its lease, which the scheduler grants only while the child has a
slot free (a request waiting for one waits in the model's queue, under its one timeout), so
a child never has more requests than it serves. A client that takes no streamed data for
``--client-timeout`` is cut off, so one that stops reading cannot hold a slot for ever.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from node_agent.api.connections import DEFAULT_CLIENT_TIMEOUT
from node_agent.api.replies import NO_RETRY, child_error_with_fix
from node_agent.api.request_record import Exchange
from node_agent.api.wire import (
    CONNECT_TIMEOUT,
    Answer,
    Connection,
    Pool,
    Target,
    Wait,
    WireError,
    request_head,
)
from node_agent.child.keys import child_key
from node_agent.child.ports import CHILD_HOST
from node_agent.core.event_frames import EventFrames
from node_agent.core.scheduler_events import ChildFault
from node_agent.errors import ApiError

log = logging.getLogger("corral.proxy")

MAX_POOLS = 64
_K = TypeVar("_K", int, Target)
# A client's unsent bytes past which the child's connection is read no further until the
# client takes them (aiohttp's own limit for a response's writes).
CLIENT_BUFFER = 64 * 1024
# The handshake's own fields: aiohttp's client makes a new one towards the child.
_WS = frozenset(
    ("sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
     "sec-websocket-extensions")
)  # fmt: skip
# A child's own failures (501 is an endpoint it does not have: not a failure of the child).
_CHILD_ERRORS = frozenset({500, 502, 503, 504})
# RFC 9110 §7.6.1 hop-by-hop fields, plus those computed anew for the forwarded message
# (Expect: the agent has read the body already; a child told to expect one more would answer
# 100 Continue first).
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Content-Encoding",
        "Expect",
    )
)


def forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """``headers`` less the hop-by-hop ones: the fixed set, and those ``Connection`` names
    (RFC 9110 §7.6.1; a child's were passed on, issue 26 row 18)."""
    named = {
        token.strip().lower()
        for key, value in headers.items()
        if key.lower() == "connection"
        for token in value.split(",")
    }
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP_BY_HOP and key.lower() not in named:
            out.add(key, value)
    return out


@dataclass(frozen=True)
class ProxyStatistics:
    targets: int  # children (by port) and peers with a pool (at most MAX_POOLS each)
    idle: int  # keep-alive connections waiting for a request
    busy: int  # connections carrying one


class Proxy:
    """Requests to the children and the peers over HTTP/1.1 connections of its own
    (``api/wire.py``): per target a pool of keep-alive connections, whose idle ones close
    before a child is asked to exit."""

    def __init__(
        self,
        *,
        timeout: float,
        client_timeout: float = DEFAULT_CLIENT_TIMEOUT,
        stream_gather: float = 0.0,
    ) -> None:
        """``stream_gather``: ``--stream-gather``, the window in which a child's fast stream
        gathers its events (core/stream_pace.py). A peer's streams do not: the peer gathered."""
        self._timeout = timeout
        self._client_timeout = client_timeout
        self._stream_gather = stream_gather
        self._children: dict[int, Pool] = {}  # by port
        self._peers: dict[Target, Pool] = {}

    def _child_pool(self, port: int) -> Pool:
        """The pool of the child on ``port``.

        llama-server serves each connection on one of its few HTTP threads
        (``max(parallel + 2, cores - 1)``: 6 with 4 slots on 2 cores) and leaves a connection
        beyond those unread until an idle one times out, 5 s later: under load an unbounded
        pool stalled requests for 5-20 s (bench S5). The scheduler's slot leases keep the
        connections to what it serves; a request over them waits in the model's queue,
        in order, instead of in a socket nobody reads.
        """
        return self._pool(self._children, port, Target(CHILD_HOST, port), self._stream_gather)

    def _pool(self, pools: dict[_K, Pool], key: _K, target: Target, gather: float = 0.0) -> Pool:
        pool = pools.get(key)
        if pool is None:
            if len(pools) >= MAX_POOLS:  # children (and peers' pods) come and go
                for old in [k for k, each in pools.items() if each.empty()]:
                    del pools[old]
            pool = pools[key] = Pool(target, self._timeout, gather)
        return pool

    async def release_port(self, port: int) -> None:
        """The child on ``port`` is about to be asked to exit: close its idle connections now
        (a llama-server child with a keep-alive connection open takes 10 ms longer to exit: 13
        against 3 ms, measured), and a busy one once its request is done. A stream the drain
        deadline cut then reads the child's exit and ends with an error event."""
        pool = self._children.pop(port, None)
        if pool is not None:
            pool.retire()

    async def close(self) -> None:
        for pool in (*self._children.values(), *self._peers.values()):
            pool.close()
        self._children.clear()
        self._peers.clear()

    async def websocket(self, request: web.Request, port: int) -> web.StreamResponse:
        """A WebSocket session with the child on ``port`` (llama.cpp's router's ``proxy_ws``):
        the child's handshake first (its refusal is the client's answer), then one pump each
        way until either side closes, and the other is closed with it. (aiohttp's client: a
        session is rare and long, its per-message cost does not matter.)"""
        url = f"ws://{CHILD_HOST}:{port}{request.rel_url}"
        headers = {
            k: v for k, v in forward_headers(request.headers).items() if k.lower() not in _WS
        }
        headers["Authorization"] = f"Bearer {child_key(port)}"
        protocols = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            try:
                upstream = await session.ws_connect(url, headers=headers, protocols=protocols)
            except aiohttp.WSServerHandshakeError as exc:
                raise ApiError(
                    exc.status if exc.status >= 400 else 502,
                    f"the model's server did not take the WebSocket at {request.path}: "
                    f"{exc.status} {exc.message}",
                ) from None
            except aiohttp.ClientError as exc:
                raise ApiError(502, f"the model's server did not answer: {exc}") from None
            async with upstream:
                client = web.WebSocketResponse(
                    protocols=(upstream.protocol,) if upstream.protocol else ()
                )
                await client.prepare(request)
                await _pump_both(client, upstream)
                return client

    def statistics(self) -> ProxyStatistics:
        stats = [pool.statistics() for pool in (*self._children.values(), *self._peers.values())]
        return ProxyStatistics(
            targets=len(stats), idle=sum(s.idle for s in stats), busy=sum(s.busy for s in stats)
        )

    async def forward(
        self,
        request: web.Request,
        port: int,
        body: bytes | None,
        exchange: Exchange | None = None,
        *,
        buffered: bool = False,
        detached: bool = False,
    ) -> web.StreamResponse:
        """Send ``request`` (with ``body`` already read) to the child on ``port``;
        ``buffered``: answer in one piece, never a stream.

        ``detached``: a client that goes away does not end the exchange; the child's answer
        is read to its end (the child's session buffer keeps it for a later
        ``GET /v1/stream``, and the lease holds the model meanwhile)."""
        # A child's own key in place of the client's (child.keys): the agent checked that one.
        headers = forward_headers(request.headers)
        headers.popall("X-Api-Key", None)
        headers["Authorization"] = f"Bearer {child_key(port)}"
        where = f"the child on port {port}"
        return await self._relay(
            self._child_pool(port), request, body, headers, exchange, buffered, detached, where
        )

    async def forward_to(
        self,
        request: web.Request,
        target: Target,
        body: bytes | None,
        headers: Mapping[str, str],
    ) -> web.StreamResponse:
        """Send ``request`` to a peer agent at ``target`` (``api/peers.py``), with ``headers``
        added: the same streaming, cancellation and mid-answer errors as towards a child."""
        pool = self._pool(self._peers, target, target)
        sent = forward_headers(request.headers)
        sent.update(headers)
        where = f"peer {target.host}:{target.port}"
        return await self._relay(pool, request, body, sent, None, False, False, where)

    async def _relay(
        self,
        pool: Pool,
        request: web.Request,
        body: bytes | None,
        headers: CIMultiDict[str],
        exchange: Exchange | None,
        buffered: bool,
        detached: bool,
        where: str,
    ) -> web.StreamResponse:
        target = pool.target
        try:
            head = request_head(
                request.method,
                request.rel_url.raw_path_qs,
                target.authority,
                list(headers.items()),
                body,
            )
        except ValueError as exc:
            raise ApiError(400, f"the request cannot be forwarded: {exc}") from None
        conn, answer = await _ask(pool, request, head, body, exchange, where)
        try:
            if answer.status in _CHILD_ERRORS:
                _fault(exchange, ChildFault.SERVER_ERROR)
            out_headers = forward_headers(CIMultiDict(answer.headers))
            if buffered or answer.length is not None or request.method == "HEAD":
                try:
                    payload = await conn.body()
                except WireError as exc:  # it died between its headers and body
                    if exc.stalled:
                        _fault(exchange, ChildFault.STALLED)
                    log.warning("%s stopped mid-response: %s", where, exc)
                    raise ApiError(502, f"the model's server stopped mid-response: {exc}") from exc
                if exchange is not None:
                    exchange.body(payload)
                if answer.status == 501:  # a feature the child was not started with
                    payload = child_error_with_fix(payload, exchange.model if exchange else None)
                    out_headers.add(*NO_RETRY)
                return web.Response(status=answer.status, headers=out_headers, body=payload)
            return await self._stream(conn, request, answer, out_headers, exchange, detached, where)
        finally:
            conn.finish()

    async def _stream(
        self,
        conn: Connection,
        request: web.Request,
        answer: Answer,
        out_headers: CIMultiDict[str],
        exchange: Exchange | None,
        detached: bool,
        where: str,
    ) -> web.StreamResponse:
        """Pass a body of unknown length on as it comes (server-sent events: chunk by chunk),
        never buffered: the connection hands each read to a :class:`_Relay`, which writes it
        to the client's socket; this task wakes only when the client's buffer is full."""
        response = web.StreamResponse(status=answer.status, headers=out_headers)
        try:
            writer = await response.prepare(request)
        except ConnectionResetError:
            if not detached:
                raise
            writer = None  # the client left while the model loaded: read on without it
        # Events pass on whole (core/event_frames.py): a cut leaves no half event before the
        # error event.
        sse = "text/event-stream" in out_headers.get("Content-Type", "")
        relay = _Relay(
            request.transport if writer is not None else None,
            # aiohttp chose: chunked towards an HTTP/1.1 client, else until the connection
            # closes; the relay frames each read as one chunk or passes it as it is.
            response.headers.get("Transfer-Encoding") == "chunked",
            exchange,
            EventFrames() if sse else None,
            detached,
        )
        conn.stream(relay.send)
        try:
            while await conn.wait() is Wait.PAUSED:
                if relay.gone or writer is None or not await self._taken(request, writer.drain()):
                    relay.gone = True
                    if not detached:
                        # The client hung up mid-stream: closing the connection (finish)
                        # stops the child generating.
                        log.debug("client went away mid-stream from %s", where)
                        return response
                conn.resume()
        except WireError as exc:
            # The child died (or stalled) mid-stream: end the stream with an error event the
            # client can read, instead of a silently truncated body.
            if exc.stalled:
                _fault(exchange, ChildFault.STALLED)
            message = f"the model's server stopped mid-response: {exc}"
            log.warning("%s stopped mid-response: %s", where, exc)
            if sse:
                relay.write(f"data: {json.dumps(ApiError(500, message).body())}\n\n".encode())
        else:
            relay.end()
        if not relay.gone and not await self._taken(request, response.write_eof()):
            log.debug("client went away at the end of a stream from %s", where)
        return response

    async def _taken(self, request: web.Request, write: Awaitable[None]) -> bool:
        """Until the client took what it was sent (``write``: a drain, the stream's end);
        False when it is gone, or took nothing for ``--client-timeout`` (cut off then: one
        that stops reading cannot hold a slot, nor the handler, for ever)."""
        try:
            async with asyncio.timeout(self._client_timeout):
                await write
        except TimeoutError:
            log.warning(
                "%s %s: the client took no data for %gs (--client-timeout): cutting it off",
                request.method,
                request.path,
                self._client_timeout,
            )
            if request.transport is not None:
                request.transport.abort()
            return False
        except ConnectionResetError:
            return False
        return True


async def _ask(
    pool: Pool,
    request: web.Request,
    head: bytes,
    body: bytes | None,
    exchange: Exchange | None,
    where: str,
) -> tuple[Connection, Answer]:
    """A connection with ``request`` sent on it and its answer's status and headers."""
    for attempt in (1, 2):
        try:
            conn = await pool.connection()
        except WireError as exc:
            error = exc
            break
        try:
            conn.send(head, body, head_only=request.method == "HEAD")
            return conn, await conn.answer()
        except WireError as exc:
            conn.close()
            # A pooled keep-alive connection the child had already closed: nothing was
            # answered, so nothing was done. Sent once more on a fresh one, as pools do.
            if exc.retry and attempt == 1:
                continue
            error = exc
            break
        except BaseException:
            conn.close()
            raise
    if error.stalled:
        _fault(exchange, ChildFault.STALLED)
    # Logged: a lease should make this impossible for a healthy child, so each one is a lead
    # (the soak counts them).
    log.warning("%s %s: %s did not answer: %s", request.method, request.path, where, error)
    raise ApiError(502, f"the model's server did not answer: {error}")


class _Relay:
    """The sink of a streamed answer (``wire.Sink``): each read goes to the client's socket
    as it comes, framed as a chunk when the client's answer is chunked. Its answer: False
    when the client's buffer is past :data:`CLIENT_BUFFER` (the connection pauses until the
    client drains) or the client is gone; a detached stream reads on without it."""

    def __init__(
        self,
        transport: asyncio.Transport | None,
        chunked: bool,
        exchange: Exchange | None,
        frames: EventFrames | None,
        detached: bool,
    ) -> None:
        self._transport = transport
        self._chunked = chunked
        self._exchange = exchange
        self._frames = frames
        self._detached = detached
        self.gone = transport is None

    def send(self, data: bytes) -> bool:
        if self._exchange is not None:
            self._exchange.chunk(data)
        if self.gone:
            return self._detached
        if self._frames is not None:
            data = self._frames.feed(data)
            if not data:
                return True
        return self.write(data)

    def write(self, data: bytes) -> bool:
        transport = self._transport
        if self.gone or transport is None or transport.is_closing():
            self.gone = True
            return self._detached
        transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        return transport.get_write_buffer_size() <= CLIENT_BUFFER

    def end(self) -> None:
        """The stream's own end: what the event framing held (a last event without its
        blank line)."""
        if self._frames is not None and (tail := self._frames.rest()):
            self.write(tail)


WebSocket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


async def _pump(source: WebSocket, sink: WebSocket) -> None:
    async for message in source:
        if message.type is aiohttp.WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type is aiohttp.WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        else:
            break  # closing or an error: the session is over


async def _pump_both(client: web.WebSocketResponse, child: aiohttp.ClientWebSocketResponse) -> None:
    """Until either side is done; then both are closed (a session never half-open)."""
    pumps = {
        asyncio.ensure_future(_pump(client, child)),
        asyncio.ensure_future(_pump(child, client)),
    }
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        await child.close()
        await client.close()


def _fault(exchange: Exchange | None, fault: ChildFault) -> None:
    if exchange is not None:
        exchange.child_fault = fault
