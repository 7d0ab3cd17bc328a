"""The status page: ``GET /ui`` (``/`` is llama.cpp's chat UI, see ``chat_ui.py``).

One static HTML file with inline script and style (no build step): it reads the agent's own
API (``/models``, ``/ledger``, ``/models/sse``, ``POST /models/load|unload``) like any other
client, so the page needs no endpoint of its own except ``GET /ui/recent``: the last loads
and evictions, which a page opened later could not otherwise know.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import re
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from node_agent.aio import TaskSet
from node_agent.api.state import STATE
from node_agent.runtime.registry import Registry

RECENT_EVENTS = 100


class RecentEvents:
    """The last lifecycle events of the models (progress reports left out: too many)."""

    def __init__(self, registry: Registry, clock: Callable[[], float] = time.time) -> None:
        self._registry = registry
        self._clock = clock  # wall clock: the page shows the time of day
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_EVENTS)

    def add(self, model: str, event: str, data: dict[str, Any] | None) -> None:
        if data is not None and "progress" in data:
            return
        self.events.append({"time": self._clock(), "model": model, "event": event, "data": data})

    async def follow(self) -> None:
        async for event in self._registry.events():
            self.add(event.model, event.event, event.data)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        tasks = TaskSet("ui")
        tasks.spawn(self.follow(), "events", forever=True)
        yield
        await tasks.close()


RECENT: web.AppKey[RecentEvents] = web.AppKey("corral_ui_recent", RecentEvents)


def page() -> bytes:
    return resources.files("node_agent.api").joinpath("static", "index.html").read_bytes()


_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def page_headers(body: bytes) -> dict[str, str]:
    """What a browser must enforce for the page: only its own script runs (by hash, so an
    injected one does not), it talks to this agent only, and no other site may frame it
    (clickjacking a load or unload button). Inline style attributes stay allowed: the page
    draws its bars with them, and a style cannot run code."""
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _SCRIPT.findall(body)
    )
    policy = (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )
    return {
        "Cache-Control": "no-cache",
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }


def setup_ui(app: web.Application) -> None:
    """Serve the status page (call from build_app)."""
    body = page()  # read once: a missing file fails at startup, not on the first visit
    headers = page_headers(body)
    recent = RecentEvents(app[STATE].registry)
    app[RECENT] = recent

    async def status_page(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=body,
            content_type="text/html",
            charset="utf-8",
            headers=headers,
        )

    async def recent_events(request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": list(request.app[RECENT].events)})

    async def to_status_page(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMovedPermanently("/ui")  # a typed or remembered trailing slash

    app.router.add_get("/ui", status_page)
    app.router.add_get("/ui/", to_status_page)
    app.router.add_get("/ui/recent", recent_events)
    app.cleanup_ctx.append(recent.lifecycle)
