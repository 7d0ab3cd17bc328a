"""``GET /peer-view``: what this agent's peers need to know of it, pushed as it changes.

Peers used to poll each other's ``GET /models``, ``/props`` and ``/ledger`` every second: 2–3
requests per peer per agent and a full model listing parsed each time, ~40% of a core per
agent at 100 nodes (issue 25). Now each peer keeps one subscription open (``api/peers.py``),
and this agent writes one line of JSON when something a peer ranks by changed, and a bare
newline every ``KEEPALIVE`` seconds otherwise (so a silent peer is noticed):

    {"models_max": 4, "models": {"m": ["loaded", 2]}, "needs": {"m": {"CUDA0": 123}},
     "free": {"CUDA0": 456, "host": null}}

``models``: each listed model's state (``peer_rank.ranked_state``: an unloaded model with a
queue counts as loading) and its queue depth (in flight + queued); ``needs``: its
``min`` per device, with the memory ledger on; ``free``: the bytes a new load may use per
device (None: no limit there), or null with the ledger off. The view is built at most once per
runtime change (the registry's ``version``) whoever subscribes, and looked at no more often
than every ``MIN_INTERVAL``; device memory, which moves without a runtime event, is read again
every ``REFRESH`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web

from node_agent.api.long_lived import until_shutdown
from node_agent.api.peers import KEEPALIVE, ROUTE, free_memory
from node_agent.api.state import STATE
from node_agent.core.peer_rank import DOWNLOADING, ranked_state
from node_agent.runtime.registry import Registry

MIN_INTERVAL = 0.25  # a burst of changes makes one view
REFRESH = 5.0  # device memory moves without a runtime event: look again this often
# How long a subscription waits for the models' memory estimates (their GGUF headers read off
# the loop, as GET /models does) before it sends a view without the ones still on their way.
PREPARE_WAIT = 1.0


def build_view(registry: Registry, models_max: int) -> dict[str, Any]:
    """This agent's view, as ``GET /models``, ``/props`` and ``/ledger`` would give it."""
    sched, memory = registry.scheduler, registry.memory
    models: dict[str, list[Any]] = {}
    needs: dict[str, dict[str, int]] = {}
    for name in registry.listed():
        view = sched.view(name)
        state = ranked_state(
            view.state.value, view.queued, downloading=registry.downloads.active(name)
        )
        models[name] = [state, view.in_flight + view.queued]
        if memory is not None:
            needs[name] = dict(memory.ledger.figures(name).min)
    for name in registry.downloads.names():
        models.setdefault(name, [DOWNLOADING, 0])
    free = free_memory(memory.statistics()) if memory is not None else None
    return {"models_max": models_max, "models": models, "needs": needs, "free": free}


class ViewCache:
    """The encoded view, shared by every subscriber: built again when the registry changed
    and MIN_INTERVAL has passed (so at most 4 times a second however many peers subscribe
    and however busy the agent is), or REFRESH has."""

    def __init__(self, registry: Registry, models_max: int) -> None:
        self._registry = registry
        self._models_max = models_max
        self._line = b""
        self._version = -1
        self._built = -float("inf")

    def line(self) -> bytes:
        now = time.monotonic()
        age = now - self._built
        changed = self._version != self._registry.version
        if (changed and age >= MIN_INTERVAL) or age >= REFRESH:
            view = build_view(self._registry, self._models_max)
            self._line = json.dumps(view, separators=(",", ":")).encode() + b"\n"
            self._version, self._built = self._registry.version, now
        return self._line

    @property
    def behind(self) -> bool:
        """The line does not show the latest change yet (built too recently to build again)."""
        return self._version != self._registry.version


VIEWS: web.AppKey[ViewCache] = web.AppKey("corral_peer_views", ViewCache)


async def _lines(cache: ViewCache, registry: Registry) -> AsyncGenerator[bytes, None]:
    sent = b""
    prepared: object = None
    while True:
        specs = registry.specs()  # a new mapping after each reload
        if registry.memory is not None and specs is not prepared:
            # Each model's ``min`` needs its estimate: made off the loop, once per file.
            await registry.memory.prepare_off_loop(registry.listed().values(), wait=PREPARE_WAIT)
            prepared = specs
        changed = registry.changed.current()  # before the look: no change slips between
        line = cache.line()
        yield line if line != sent else b"\n"
        sent = line
        if not cache.behind:  # else it may be built again after MIN_INTERVAL: look then
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEPALIVE):
                    await changed.wait()
        await asyncio.sleep(MIN_INTERVAL)


def setup_peer_view(app: web.Application) -> None:
    """Serve ``GET /peer-view`` (call from build_app, once ``app[STATE]`` is set)."""
    state = app[STATE]
    app[VIEWS] = ViewCache(state.registry, state.settings.models_max)
    app.router.add_get(ROUTE, peer_view)


async def peer_view(request: web.Request) -> web.StreamResponse:
    """One peer's subscription (behind the API key, like every Corral route)."""
    app = request.app
    registry = app[STATE].registry
    response = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for line in until_shutdown(app, _lines(app[VIEWS], registry)):
            await response.write(line)
        await response.write_eof()
    except ConnectionResetError:  # the peer went away: done
        pass
    return response
