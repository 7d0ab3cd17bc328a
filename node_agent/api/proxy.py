"""Forward one HTTP request to a child llama-server and pass its answer back.

Bodies with a known length are answered in one piece; everything else (server-sent events,
chunked bodies) is passed through chunk by chunk as the child writes it, never buffered.

A request comes here with its lease, which the scheduler grants only while the child has a
slot free (a request waiting for one waits in the model's queue, under its one timeout), so
a child never has more requests than it serves. A client that takes no streamed data for
``--client-timeout`` is cut off, so one that stops reading cannot hold a slot for ever.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from node_agent.api.connections import DEFAULT_CLIENT_TIMEOUT
from node_agent.api.request_record import Exchange
from node_agent.child.keys import child_key
from node_agent.child.ports import CHILD_HOST
from node_agent.core.event_frames import EventFrames
from node_agent.core.links import LinkBook
from node_agent.core.scheduler_events import ChildFault
from node_agent.errors import ApiError

log = logging.getLogger("corral.proxy")

MAX_LINKS = 64
# The handshake's own fields: aiohttp's client makes a new one towards the child.
_WS = frozenset(
    ("sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
     "sec-websocket-extensions")
)  # fmt: skip
# A child's own failures (501 is an endpoint it does not have: not a failure of the child).
_CHILD_ERRORS = frozenset({500, 502, 503, 504})
# llama-server closes a keep-alive connection idle for 5 s (measured with the pinned binary).
# A pooled connection reused just as the child closes it fails with "Server disconnected"
# (aiohttp#2682; the soak hit it: a 502 for a healthy model), so ours never idle that long.
CHILD_IDLE_REUSE = 2.0

# RFC 9110 §7.6.1 hop-by-hop fields, plus those aiohttp computes itself for the new message.
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


class _ChildLink:
    """The proxy's side of one child: a connection pool of its own."""

    def __init__(self, timeout: aiohttp.ClientTimeout) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,  # the scheduler's leases limit (one connection per request in flight)
            enable_cleanup_closed=True,
            keepalive_timeout=CHILD_IDLE_REUSE,
        )
        # auto_decompress off: the child's bytes go to the client as they are.
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )


@dataclass(frozen=True)
class ProxyStatistics:
    links: int
    retired: int  # links of exiting children that streams still read
    users: int


class Proxy:
    """HTTP clients to the children: per child, keep-alive connections that are released
    before the child is asked to exit (the :class:`LinkBook` decides when)."""

    def __init__(self, *, timeout: float, client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._client_timeout = client_timeout
        self._book = LinkBook()
        self._links: dict[int, _ChildLink] = {}  # by the book's link id

    async def _link(self, port: int) -> tuple[int, _ChildLink]:
        """The link to the child on ``port``.

        llama-server serves each connection on one of its few HTTP threads
        (``max(parallel + 2, cores - 1)``: 6 with 4 slots on 2 cores) and leaves a connection
        beyond those unread until an idle one times out, 5 s later: under load an unbounded
        pool stalled requests for 5-20 s (bench S5). The scheduler's slot leases keep the
        connections to what it serves; a request over them waits in the model's queue,
        in order, instead of in a socket nobody reads.
        """
        link_id = self._book.current(port)
        if link_id is not None:
            return link_id, self._links[link_id]
        if len(self._links) > MAX_LINKS:
            # Children come and go on new ports: drop the links nobody is using.
            for old in self._book.idle():
                self._book.retire_link(old)
                await self._close(old)
        link_id, replaced = self._book.add(port)
        # Registered before the next await: a request arriving meanwhile finds it.
        link = self._links[link_id] = _ChildLink(self._timeout)
        if replaced is not None:
            await self._close(replaced)
        return link_id, link

    async def _close(self, link_id: int) -> None:
        link = self._links.pop(link_id, None)
        if link is not None:
            await link.session.close()

    async def release_port(self, port: int) -> None:
        """The child on ``port`` is about to be asked to exit: close its idle connections now
        (a llama-server child with a keep-alive connection open takes 10 ms longer to exit: 13
        against 3 ms, measured), and a busy link once its last request is done. A stream the
        drain deadline cut then reads the child's exit and ends with an error event."""
        link_id = self._book.retire(port)
        if link_id is not None:
            await self._close(link_id)

    async def close(self) -> None:
        for link_id in list(self._links):
            await self._close(link_id)

    async def websocket(self, request: web.Request, port: int) -> web.StreamResponse:
        """A WebSocket session with the child on ``port`` (llama.cpp's router's ``proxy_ws``):
        the child's handshake first (its refusal is the client's answer), then one pump each
        way until either side closes, and the other is closed with it."""
        link_id, link = await self._link(port)
        self._book.enter(link_id)
        try:
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
            try:
                upstream = await link.session.ws_connect(url, headers=headers, protocols=protocols)
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
        finally:
            if self._book.leave(link_id):
                await self._close(link_id)

    def statistics(self) -> ProxyStatistics:
        book = self._book.statistics()
        return ProxyStatistics(links=book.links, retired=book.retired, users=book.users)

    async def _send(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        url: str,
        headers: CIMultiDict[str],
        body: bytes | None,
        port: int,
        exchange: Exchange | None,
        server_name: str | None,
    ) -> aiohttp.ClientResponse:
        for attempt in (1, 2):
            try:
                return await session.request(
                    request.method,
                    url,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                    server_hostname=server_name,
                )
            except aiohttp.ServerDisconnectedError:
                # A pooled keep-alive connection the child had already closed (it does so
                # after some streamed responses): nothing was answered, so nothing was done.
                # Send once more on a fresh connection, as HTTP client pools do.
                if attempt == 1:
                    continue
                exc_text = "Server disconnected"
            except aiohttp.ServerTimeoutError as exc:  # it took the request, then said nothing
                _fault(exchange, ChildFault.STALLED)
                exc_text = str(exc) or "no answer within --timeout"
            except aiohttp.ClientError as exc:
                exc_text = str(exc)
            # Logged: a lease should make this impossible for a healthy child, so each one is
            # a lead (the soak counts them).
            log.warning(
                "%s %s: the child on port %d did not answer: %s",
                request.method,
                request.path,
                port,
                exc_text,
            )
            raise ApiError(502, f"the model's server did not answer: {exc_text}")
        raise AssertionError("unreachable")

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
        link_id, link = await self._link(port)
        self._book.enter(link_id)
        try:
            return await self._forward(
                link.session, request, port, body, exchange, buffered, detached
            )
        finally:
            if self._book.leave(link_id):
                await self._close(link_id)

    async def forward_to(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        base: str,
        port: int,
        body: bytes | None,
        headers: Mapping[str, str],
        server_name: str | None = None,
    ) -> web.StreamResponse:
        """Send ``request`` to a peer agent at ``base`` (``api/peers.py``), with ``headers``
        added (``server_name``: the name its certificate is checked against, None: its
        host): the same streaming, cancellation and mid-answer errors as towards a child."""
        return await self._forward(
            session, request, port, body, None, base=base, extra=headers, server_name=server_name
        )

    async def _forward(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        port: int,
        body: bytes | None,
        exchange: Exchange | None,
        buffered: bool = False,
        detached: bool = False,
        *,
        base: str | None = None,
        extra: Mapping[str, str] | None = None,
        server_name: str | None = None,
    ) -> web.StreamResponse:
        url = f"{base or f'http://{CHILD_HOST}:{port}'}{request.rel_url}"
        headers = forward_headers(request.headers)
        if base is None:
            # A child's own key in place of the client's (child.keys): the agent checked that
            # one. A peer agent gets its own key in ``extra`` instead.
            headers.popall("X-Api-Key", None)
            headers["Authorization"] = f"Bearer {child_key(port)}"
        headers.update(extra or {})
        upstream = await self._send(
            session, request, url, headers, body, port, exchange, server_name
        )
        if upstream.status in _CHILD_ERRORS:
            _fault(exchange, ChildFault.SERVER_ERROR)
        async with upstream:
            out_headers = forward_headers(upstream.headers)
            if buffered or (
                upstream.content_length is not None
                and "chunked" not in upstream.headers.get("Transfer-Encoding", "")
            ):
                try:
                    payload = await upstream.read()
                except aiohttp.ClientError as exc:  # it died between its headers and body
                    if isinstance(exc, aiohttp.ServerTimeoutError):
                        _fault(exchange, ChildFault.STALLED)
                    log.warning("the child on port %d stopped mid-response: %s", port, exc)
                    raise ApiError(502, f"the model's server stopped mid-response: {exc}") from exc
                if exchange is not None:
                    exchange.body(payload)
                return web.Response(status=upstream.status, headers=out_headers, body=payload)
            # Never pooled again: llama-server closes its socket after a chunked answer without
            # sending "Connection: close" (measured), and a request that reused it in that
            # moment failed with "Can not write request body" (a 502 found by the soak). Marked
            # now: aiohttp returns a connection to its pool the moment the body ends.
            if upstream.connection is not None and upstream.connection.protocol is not None:
                upstream.connection.protocol.force_close()
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            try:
                await response.prepare(request)
            except ConnectionResetError:
                if not detached:
                    raise
                await _drain(upstream, exchange)  # the client left while the model loaded
                return response
            watch = _ReadWatch(request, self._client_timeout)
            # Events pass on whole (core/event_frames.py): a cut leaves no half event before
            # the error event.
            sse = "text/event-stream" in upstream.headers.get("Content-Type", "")
            frames = EventFrames() if sse else None
            try:
                try:
                    async for chunk in upstream.content.iter_any():
                        if exchange is not None:
                            exchange.chunk(chunk)
                        if frames is not None:
                            chunk = frames.feed(chunk)
                        if chunk:
                            await watch.write(response, chunk)
                    if frames is not None and (tail := frames.rest()):
                        await watch.write(response, tail)
                except ConnectionResetError:
                    raise  # the client's side (below), though aiohttp's is a ClientError too
                except aiohttp.ClientError as exc:
                    # The child died (or stalled) mid-stream: end the stream with an error
                    # event the client can read, instead of a silently truncated body.
                    if isinstance(exc, aiohttp.ServerTimeoutError):
                        _fault(exchange, ChildFault.STALLED)
                    message = f"the model's server stopped mid-response: {exc}"
                    log.warning("the child on port %d stopped mid-response: %s", port, exc)
                    if frames is not None:
                        error = ApiError(500, message).body()
                        await watch.write(response, f"data: {json.dumps(error)}\n\n".encode())
                await response.write_eof()
            except ConnectionResetError:
                # The client hung up mid-stream: aiohttp's next write raises (found by the
                # soak, where it surfaced as an "unexpected error" traceback). Nobody is left
                # to answer; leaving ``upstream`` unread closes its connection, and the child
                # stops generating.
                log.debug("client went away mid-stream from port %d", port)
                if detached:
                    await _drain(upstream, exchange)
            finally:
                watch.close()
            return response


class _ReadWatch:
    """Cuts off a client that takes no streamed data for the client timeout: one that stops
    reading is treated as if it had hung up (ConnectionResetError), which closes the stream
    from the child and frees its slot.

    A write waits only while the client's socket is full, so instead of a timeout around
    every chunk (a timer made and cancelled per token, issue 30) one timer per timeout period
    looks at the write under way, if any."""

    def __init__(self, request: web.Request, timeout: float) -> None:
        self._request = request
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None  # when the write under way began
        self._cut = False
        self._timer = self._loop.call_later(timeout, self._check)

    async def write(self, response: web.StreamResponse, data: bytes) -> None:
        self._since = self._loop.time()
        try:
            await response.write(data)
        finally:
            self._since = None
        if self._cut:
            raise ConnectionResetError("the client stopped reading")

    def _check(self) -> None:
        since, now = self._since, self._loop.time()
        if since is not None and now - since >= self._timeout:
            request = self._request
            log.warning(
                "%s %s: the client took no data for %gs (--client-timeout): cutting it off",
                request.method,
                request.path,
                self._timeout,
            )
            self._cut = True
            if request.transport is not None:
                request.transport.abort()
            return
        wait = self._timeout if since is None else since + self._timeout - now
        self._timer = self._loop.call_later(wait, self._check)

    def close(self) -> None:
        self._timer.cancel()


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


async def _drain(upstream: aiohttp.ClientResponse, exchange: Exchange | None) -> None:
    """Read a detached stream to its end without a client (see ``Proxy.forward``)."""
    try:
        async for chunk in upstream.content.iter_any():
            if exchange is not None:
                exchange.chunk(chunk)
    except aiohttp.ClientError as exc:
        log.warning("a detached stream ended early: %s", exc)
