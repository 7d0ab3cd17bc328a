"""Forward one HTTP request to a child llama-server and pass its answer back.

Bodies with a known length are answered in one piece; everything else (server-sent events,
chunked bodies) is passed through chunk by chunk as the child writes it, never buffered.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from node_agent.errors import ApiError
from node_agent.router.exchange import Exchange

log = logging.getLogger(__name__)

CHILD_HOST = "127.0.0.1"
MAX_LINKS = 64
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


def _forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP_BY_HOP:
            out.add(key, value)
    return out


class _ChildLink:
    """The proxy's side of one child: a gate of its slots and a connection pool of its own."""

    def __init__(self, slots: int, timeout: aiohttp.ClientTimeout) -> None:
        self.slots = slots
        self.semaphore = asyncio.Semaphore(slots)
        self.users = 0  # requests holding or waiting for the semaphore
        connector = aiohttp.TCPConnector(
            limit=0,  # the gate limits
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


class Proxy:
    """HTTP clients to the children: per child, a gate of its slots and keep-alive connections
    that are closed before the child is asked to exit."""

    def __init__(self, *, timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._links: dict[int, _ChildLink] = {}

    async def _link(self, port: int, slots: int) -> _ChildLink:
        """The link to the child on ``port``, which serves ``slots`` requests at once.

        llama-server serves each connection on one of its few HTTP threads
        (``max(parallel + 2, cores - 1)``: 6 with 4 slots on 2 cores) and leaves a connection
        beyond those unread until an idle one times out, 5 s later: under load an unbounded
        pool stalled requests for 5-20 s (bench S5). Its slots are all it can serve anyway;
        a request over them waits at the gate, in order, instead of in a socket nobody reads.
        """
        link = self._links.get(port)
        if link is not None and (link.slots == slots or link.users > 0):
            return link  # a new slot count applies once the link is idle
        if link is not None:
            await self.close_port(port)
        if len(self._links) > MAX_LINKS:
            # Children come and go on new ports: drop the links nobody is using.
            for old in [p for p, k in self._links.items() if k.users == 0]:
                await self.close_port(old)
        link = self._links[port] = _ChildLink(slots, self._timeout)
        return link

    async def close_port(self, port: int) -> None:
        """Close the connections to the child on ``port``: called before it is asked to exit.

        A llama-server child with a keep-alive connection open takes 10 ms longer to exit (13
        against 3 ms, measured): its HTTP thread waits on the idle socket. Every model switch
        pays that, so the registry closes them first (nothing is in flight by then).
        """
        link = self._links.pop(port, None)
        if link is not None:
            await link.session.close()

    async def close(self) -> None:
        for port in list(self._links):
            await self.close_port(port)

    async def _send(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        url: str,
        headers: CIMultiDict[str],
        body: bytes | None,
        port: int,
    ) -> aiohttp.ClientResponse:
        for attempt in (1, 2):
            try:
                return await session.request(
                    request.method, url, headers=headers, data=body, allow_redirects=False
                )
            except aiohttp.ServerDisconnectedError:
                # A pooled keep-alive connection the child had already closed (it does so
                # after some streamed responses): nothing was answered, so nothing was done.
                # Send once more on a fresh connection, as HTTP client pools do.
                if attempt == 1:
                    continue
                exc_text = "Server disconnected"
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
        slots: int,
    ) -> web.StreamResponse:
        """Send ``request`` (with ``body`` already read) to the child on ``port``, which
        serves ``slots`` requests at once."""
        link = await self._link(port, slots)
        link.users += 1
        try:
            async with link.semaphore:
                return await self._forward(link.session, request, port, body, exchange)
        finally:
            link.users -= 1

    async def _forward(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        port: int,
        body: bytes | None,
        exchange: Exchange | None,
    ) -> web.StreamResponse:
        url = f"http://{CHILD_HOST}:{port}{request.rel_url}"
        headers = _forward_headers(request.headers)
        upstream = await self._send(session, request, url, headers, body, port)
        async with upstream:
            out_headers = _forward_headers(upstream.headers)
            if upstream.content_length is not None and "chunked" not in upstream.headers.get(
                "Transfer-Encoding", ""
            ):
                try:
                    payload = await upstream.read()
                except aiohttp.ClientError as exc:  # it died between its headers and body
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
            await response.prepare(request)
            try:
                try:
                    async for chunk in upstream.content.iter_any():
                        if exchange is not None:
                            exchange.chunk(chunk)
                        await response.write(chunk)
                except ConnectionResetError:
                    raise  # the client's side (below), though aiohttp's is a ClientError too
                except aiohttp.ClientError as exc:
                    # The child died mid-stream: end the stream with an error event the client
                    # can read, instead of a silently truncated body.
                    message = f"the model's server stopped mid-response: {exc}"
                    log.warning("the child on port %d stopped mid-response: %s", port, exc)
                    if "text/event-stream" in upstream.headers.get("Content-Type", ""):
                        error = ApiError(500, message).body()
                        await response.write(f"data: {json.dumps(error)}\n\n".encode())
                await response.write_eof()
            except ConnectionResetError:
                # The client hung up mid-stream: aiohttp's next write raises (found by the
                # soak, where it surfaced as an "unexpected error" traceback). Nobody is left
                # to answer; leaving ``upstream`` unread closes its connection, and the child
                # stops generating.
                log.debug("client went away mid-stream from port %d", port)
            return response
