"""``GET /metrics`` of the agent itself, in Prometheus text format.

``setup_metrics(app)`` adds three things to an app made by ``build_app``:

* a middleware that answers ``GET /metrics`` *without* ``?model=`` from the agent's own
  metrics; with ``?model=`` the request goes on to the route ``build_app`` made, which proxies
  the child's own ``/metrics`` (llama.cpp's router does the same). A middleware, not a route,
  because ``/metrics`` is already routed and aiohttp resolves in registration order;
* the same middleware puts an :class:`~node_agent.api.request_record.Exchange` on every request
  and, when the response has ended, counts it (proxied endpoints only), with its queue wait
  and the tokens the child reported;
* a background task that follows ``registry.events()`` (the ``/models/sse`` messages) for
  loads and evictions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cached_property
from typing import TYPE_CHECKING

from aiohttp import web

from node_agent.aio import TaskSet
from node_agent.api.request_record import EXCHANGE, Exchange, route_pattern
from node_agent.api.state import PROXIED_GET, PROXIED_POST, STATE
from node_agent.clip import clip
from node_agent.errors import ApiError
from node_agent.runtime.registry import Registry

if TYPE_CHECKING:
    from node_agent.api.metrics_families import Families, LifecycleTracker

log = logging.getLogger("corral.metrics")
# Its own logger, so the per-request lines can be turned down alone.
request_log = logging.getLogger("corral.requests")

# nginx's code for "the client closed the connection before the response": the handler was
# cancelled (aiohttp's handler_cancellation), so no status ever reached anyone.
CLIENT_WENT_AWAY = 499
UNMATCHED = "(no route)"  # the endpoint label of a request no route took


class AgentMetrics:
    """One app's metrics: the families, the event tracker, and the scrape."""

    def __init__(
        self,
        registry: Registry,
        proxied: Callable[[web.Request], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._proxied = proxied
        self._clock = clock

    # Built at first use: prometheus_client is not needed to start listening (the agent
    # imports it in the background once it listens).
    @cached_property
    def families(self) -> Families:
        from node_agent.api.metrics_families import Families, SnapshotCollector

        families = Families()
        families.registry.register(SnapshotCollector(self._registry))
        return families

    @cached_property
    def tracker(self) -> LifecycleTracker:
        from node_agent.api.metrics_families import LifecycleTracker

        return LifecycleTracker(self.families)

    def scrape(self) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if self._registry.memory is not None:
            self._registry.memory.refresh()  # the ledger's figures as of this scrape
        return web.Response(
            # Its labels are route patterns and model names redacted as they were made
            # (metrics_families.model_label): bounded in number and already clean.
            body=generate_latest(self.families.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    def finished(self, request: web.Request, status: int, exchange: Exchange) -> None:
        if exchange.model is not None or self._proxied(request):
            now = self._clock()
            endpoint = route_pattern(request) or UNMATCHED
            self.families.observe_request(endpoint, status, exchange, now)
            log_request(request, status, exchange, now)

    async def follow_events(self) -> None:
        async for event in self._registry.events():
            self.tracker.on_event(event.model, event.event, event.data, self._clock())

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: follow events from startup (before load-on-startup) to cleanup."""
        tasks = TaskSet("metrics")
        tasks.spawn(self.follow_events(), "events", forever=True)
        yield
        await tasks.close()


def log_request(request: web.Request, status: int, exchange: Exchange, now: float) -> None:
    """One line per proxied request: model, status, wait (queue and load), duration, tokens."""
    if not request_log.isEnabledFor(logging.INFO):
        return
    wait = exchange.wait_seconds
    usage = exchange.usage
    request_log.info(
        "%s %s model=%s status=%d wait=%s duration=%.3fs prompt_tokens=%s generated_tokens=%s",
        request.method,
        clip(request.path),
        exchange.model or "-",
        status,
        f"{wait:.3f}s" if wait is not None else "-",
        now - exchange.started,
        usage.prompt_tokens if usage is not None else "-",
        usage.generated_tokens if usage is not None else "-",
    )


METRICS: web.AppKey[AgentMetrics] = web.AppKey("corral_metrics", AgentMetrics)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics = request.app[METRICS]
    if request.path == "/metrics" and request.method == "GET" and "model" not in request.query:
        return metrics.scrape()
    exchange = request[EXCHANGE] = Exchange()
    status = 500  # an unexpected exception: errors_middleware answers 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except ApiError as exc:
        status = exc.status
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = CLIENT_WENT_AWAY
        raise
    finally:
        metrics.finished(request, status, exchange)


def setup_metrics(app: web.Application) -> None:
    """Serve the agent's own ``GET /metrics`` and count what passes (call from build_app)."""
    posts, gets = frozenset(PROXIED_POST), frozenset(PROXIED_GET)

    def proxied(request: web.Request) -> bool:
        """A request to a proxied route, even one refused before its model was known."""
        if request.method == "POST":  # by the route's pattern: /slots/{id_slot}
            return (route_pattern(request) or request.path) in posts
        return request.method == "GET" and request.path in gets and "model" in request.query

    metrics = AgentMetrics(app[STATE].registry, proxied)
    app[METRICS] = metrics
    app.middlewares.append(metrics_middleware)
    app.cleanup_ctx.append(metrics.lifecycle)
