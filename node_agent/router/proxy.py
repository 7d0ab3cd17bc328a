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
MAX_GATES = 64
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


class _Gate:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.semaphore = asyncio.Semaphore(slots)
        self.users = 0  # requests holding or waiting for the semaphore


class Proxy:
    """A pooled HTTP client to the children (keep-alive connections per child port)."""

    def __init__(self, *, timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._gates: dict[int, _Gate] = {}

    def _gate(self, port: int, slots: int) -> _Gate:
        """At most ``slots`` requests at once to the child on ``port``.

        llama-server serves each connection on one of its few HTTP threads
        (``max(parallel + 2, cores - 1)``: 6 with 4 slots on 2 cores) and leaves a connection
        beyond those unread until an idle one times out, 5 s later: under load an unbounded
        pool stalled requests for 5-20 s (bench S5). Its slots are all it can serve anyway;
        a request over them waits here, in order, instead of in a socket nobody reads.
        """
        gate = self._gates.get(port)
        if gate is None or gate.slots != slots:
            if len(self._gates) > MAX_GATES:
                # Children come and go on new ports: forget the gates nobody is using.
                for old in [p for p, g in self._gates.items() if g.users == 0]:
                    del self._gates[old]
            gate = self._gates[port] = _Gate(slots)
        return gate

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            force_close=False,
            enable_cleanup_closed=True,
            keepalive_timeout=CHILD_IDLE_REUSE,
        )
        # auto_decompress off: the child's bytes go to the client as they are.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(
        self,
        request: web.Request,
        url: str,
        headers: CIMultiDict[str],
        body: bytes | None,
        port: int,
    ) -> aiohttp.ClientResponse:
        assert self._session is not None, "proxy not started"
        for attempt in (1, 2):
            try:
                return await self._session.request(
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
        gate = self._gate(port, slots)
        gate.users += 1
        try:
            async with gate.semaphore:
                return await self._forward(request, port, body, exchange)
        finally:
            gate.users -= 1

    async def _forward(
        self,
        request: web.Request,
        port: int,
        body: bytes | None,
        exchange: Exchange | None,
    ) -> web.StreamResponse:
        assert self._session is not None, "proxy not started"
        url = f"http://{CHILD_HOST}:{port}{request.rel_url}"
        headers = _forward_headers(request.headers)
        upstream = await self._send(request, url, headers, body, port)
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
