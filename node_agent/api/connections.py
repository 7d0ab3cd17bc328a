"""Bounds on client connections, so slow or silent clients cannot hold the agent (issue 16,
rows 6 and 7).

aiohttp keeps a connection that never sends a request, or sends its head a byte at a time, or
idles between requests, for ``keepalive_timeout`` (3630 s by default) and accepts connections
until the process runs out of file descriptors, after which even ``/health`` fails. Here:

* **Head and idle**: aiohttp's keep-alive timer runs from the connection's start (and from each
  response) until a whole request head has arrived, and is not reset by partial data; set to
  ``--client-timeout`` it bounds both a silent connection and a slow head.
* **Body**: ``bodies.read_body`` must have the whole body within ``--client-timeout`` (then
  408, and aiohttp's lingering close reads what is left for at most 10 s more).
* **Writes**: the proxy gives up on a client that takes no chunk for ``--client-timeout``
  (``proxy.py``), so a client that stops reading frees its child's slot.
* **Count**: at most ``--max-connections`` open at once. A new connection over the bound first
  closes the oldest one that has no request in progress (idle, or still sending its head) and
  is older than ``GRACE_SECONDS``, then the oldest still sending its body, then the newest idle
  one; only when every connection is busy in a handler is the new one closed. So a flood of
  slow or idle sockets never keeps ``/health`` (or anyone) out.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)

DEFAULT_CLIENT_TIMEOUT = 30.0
# File descriptors kept for everything else: children's pipes, connections to children, logs.
FD_RESERVE = 128
MAX_CONNECTIONS_CEILING = 4096

# Connections whose handler is still reading the request body (bodies.read_body marks them,
# and always unmarks them): after idle ones, the first to go when the bound is reached.
_receiving: set[object] = set()


def default_max_connections() -> int:
    """Half of what the descriptor limit leaves after FD_RESERVE, within [16, ceiling]."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS_CEILING
    return max(16, min(MAX_CONNECTIONS_CEILING, (soft - FD_RESERVE) // 2))


def mark_receiving(protocol: object, receiving: bool) -> None:
    if receiving:
        _receiving.add(protocol)
    else:
        _receiving.discard(protocol)


class BoundedServer(web.Server):
    """aiohttp's server with a bound on open connections (see the module's docstring)."""

    def __init__(self, *args: Any, max_connections: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = max_connections
        self.evicted = 0
        self._since: dict[RequestHandler, float] = {}  # when each connection was made

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        open_now = self.connections  # oldest first (insertion order)
        if len(open_now) >= self.max_connections:
            victim = _victim(open_now, self._since, self._loop.time())
            self.evicted += 1
            if victim is None:
                log.warning(
                    "%d connections open, every one in a request (--max-connections): "
                    "closing the new one",
                    len(open_now),
                )
                transport.close()
            else:
                victim.force_close()
        self._since[handler] = self._loop.time()
        super().connection_made(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._since.pop(handler, None)
        super().connection_lost(handler, exc)


# A connection younger than this is not "idle" yet: it may be a client that connected a moment
# ago and is sending its request now (a flood must not push out the /health probe it follows).
GRACE_SECONDS = 1.0


def _victim(
    handlers: list[RequestHandler], since: dict[RequestHandler, float], now: float
) -> RequestHandler | None:
    """Which connection makes room: the oldest one idle (or headless) past the grace period,
    else the oldest still sending its body, else the newest idle one."""
    # A closed one stays listed until its task has ended: skip those.
    live = [h for h in handlers if h.transport is not None and not h.transport.is_closing()]
    idle = [h for h in live if h._current_request is None]  # idle, or its head not yet in
    for handler in idle:
        if now - since.get(handler, now) >= GRACE_SECONDS:
            return handler
    for handler in live:
        if handler in _receiving:
            return handler
    return idle[-1] if idle else None


class BoundedRunner(web.AppRunner):
    """An AppRunner whose server is a :class:`BoundedServer`."""

    def __init__(self, app: web.Application, *, max_connections: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._max_connections = max_connections

    async def _make_server(self) -> web.Server:
        # The app's own server, rebuilt with the same handler and settings (its handler_args
        # merged in), plus the bound.
        plain = await super()._make_server()
        return BoundedServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            max_connections=self._max_connections,
            **plain._kwargs,
        )
