"""The agent's peers (``--peer URL``, ``--peers-from-service``): what each one has loaded, and
one-hop forwarding to it.

The agent keeps one subscription open to every peer (``GET /peer-view``, ``api/peer_view.py``,
with the agent's own ``--api-key``: one key cluster-wide), and the peer writes its view when it
changes: per model its state and queue depth (in flight + queued), its ``--models-max``, and,
where its memory ledger is on, each model's ``min`` and its free memory per device, so that
"fits with no eviction" means a free slot and the memory for it. Nothing travels at rest but a
newline every 2 s (it used to be 2–3 polls per peer per second, each a full ``GET /models``
parsed). A peer whose subscription breaks, or that stays silent for three keepalives, drops
out until it answers again. Which node
serves a request is the pure core's decision (``core/peer_rank.py``); this module gathers the
figures and carries it out.

A forwarded request carries ``X-Corral-Forwarded: <this agent>``; an agent never forwards a
request that carries it (one hop, never a loop). The forward goes through the proxy's own
streaming path: server-sent events pass through as the peer writes them, a client that goes
away closes the connection to the peer, and a peer that dies mid-answer ends a stream with the
proxy's error event (a 502 JSON before any byte was sent), never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from node_agent.aio import TaskSet
from node_agent.api.proxy import Proxy
from node_agent.api.wire import Target
from node_agent.core.peer_rank import LOADING, RESIDENT, Choice, Node, choose, effective_state, fits
from node_agent.errors import ApiError
from node_agent.runtime.registry import Registry

log = logging.getLogger("corral.peers")

FORWARDED = "X-Corral-Forwarded"
ROUTE = "/peer-view"  # each agent's view for its peers (api/peer_view.py)
KEEPALIVE = 2.0  # seconds without a view: a bare newline (peers drop one silent for 3 times it)
RECONCILE_SECONDS = 1.0  # how soon a peer discovered (or gone) is followed (or left)
RETRY_SECONDS = 1.0  # between a broken subscription and the next try
# A peer that sends nothing, not even its keepalive, for this long is left out.
SUBSCRIPTION_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=3 * KEEPALIVE)
MAX_VIEW_BYTES = 4 * 1024 * 1024  # a peer's view is input too: bounded (1,000 models: ~100 KB)

# (models_max, models: name -> (state, queue), needs: name -> min per device, free per device)
PeerView = tuple[
    int, dict[str, tuple[str, int]], dict[str, dict[str, int]], dict[str, int | None] | None
]


def parse_view(line: bytes) -> PeerView:
    """One line of a peer's ``GET /peer-view`` (``api/peer_view.py``), checked: ValueError
    names what is wrong."""
    try:
        raw = json.loads(line)
        models_max = raw["models_max"]
        models = {
            name: (state, queue)
            for name, (state, queue) in raw["models"].items()
            if isinstance(state, str) and _count(queue)
        }
        needs = {
            name: {str(d): n for d, n in need.items() if _count(n)}
            for name, need in raw["needs"].items()
            if isinstance(need, dict)
        }
        free = raw["free"]
        if free is not None:
            free = {str(d): n for d, n in free.items() if n is None or _int(n)}
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise ValueError(f"a malformed view ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if not _count(models_max) or len(models) != len(raw["models"]):
        raise ValueError("a malformed view (models_max, or a model's state or queue)")
    return models_max, models, needs, free


async def _lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The lines of a peer's view stream, each at most MAX_VIEW_BYTES (ValueError past it),
    in time linear in what it sends: only the new chunk is searched for the line's end."""
    parts: list[bytes] = []
    held = 0
    async for chunk in chunks:
        while chunk:
            end = chunk.find(b"\n")
            if end < 0:
                parts.append(chunk)
                held += len(chunk)
                break
            parts.append(chunk[:end])
            yield b"".join(parts)
            parts, held, chunk = [], 0, chunk[end + 1 :]
        if held > MAX_VIEW_BYTES:
            raise ValueError(f"a view over {MAX_VIEW_BYTES} bytes")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class PeerState:
    url: str
    reachable: bool = False
    models_max: int = 0
    models: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (state, queue)
    needs: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> min, bytes/device
    free: dict[str, int | None] | None = None  # bytes a new load may use; None: ledger off
    error: str | None = None


class Peers:
    """The peer view and the forwarder, for one agent."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        agent_id: str,
        api_key: str | None,
        registry: Registry,
        models_max: int,
        proxy: Proxy,
        timeout: float,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.agent_id = agent_id
        self._given = tuple(urls)  # --peer: always peers; discovered ones come and go
        self.peers = {url: PeerState(url) for url in urls}
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._registry = registry
        self._models_max = models_max
        self._proxy = proxy
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        # HTTPS peers: checked against --peer-ca-file (or the system's CAs), and by
        # --peer-server-name instead of their addresses (pod IPs no certificate names).
        self._tls = tls or ssl.create_default_context()
        self._server_name = server_name
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # As the proxy's own sessions: the peer's bytes go to the client as they are, and
            # no connection limit here (aiohttp's default is 100): the peer's own gate limits.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._tls),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    def use_discovered(self, urls: Sequence[str]) -> None:
        """The peer set is now ``--peer``'s and these (``api/peer_discovery.py``): a peer
        still there keeps its view, a new one is followed within RECONCILE_SECONDS, a gone one
        is dropped (a request already forwarded to it finishes or fails on its own)."""
        wanted = dict.fromkeys((*self._given, *urls))
        added = [url for url in wanted if url not in self.peers]
        gone = [url for url in self.peers if url not in wanted]
        self.peers = {url: self.peers.get(url) or PeerState(url) for url in wanted}
        if added or gone:
            log.info("peers: %d (added %s; gone %s)", len(self.peers), added or "-", gone or "-")

    async def run(self) -> None:
        """Follow every peer's view, one subscription each, for as long as the agent runs;
        the peer set may change meanwhile (``use_discovered``)."""
        tasks = TaskSet("peers")
        followers: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for url in list(followers):
                    if url not in self.peers or followers[url].done():
                        followers.pop(url).cancel()
                for url in self.peers.keys() - followers.keys():
                    followers[url] = tasks.spawn(self._follow(url), f"follow:{url}")
                await asyncio.sleep(RECONCILE_SECONDS)
        finally:
            await tasks.close()

    async def _follow(self, url: str) -> None:
        """Keep ``url``'s subscription open; while it is not, the peer is left out."""
        while url in self.peers:
            try:
                await self._subscribe(url)
                error = "its view ended (it is shutting down)"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                error = str(exc) or type(exc).__name__
            self._lost(url, error)
            await asyncio.sleep(RETRY_SECONDS)

    async def _subscribe(self, url: str) -> None:
        async with self._client().get(
            url + ROUTE,
            headers=self._auth,
            timeout=SUBSCRIPTION_TIMEOUT,
            server_hostname=self._server_name,
        ) as answer:
            if answer.status != 200:
                older = " (an agent without peer views: upgrade it)" if answer.status == 404 else ""
                raise ValueError(f"GET {ROUTE} answered {answer.status}{older}")
            last: PeerView | None = None
            async for line in _lines(answer.content.iter_any()):
                if line.strip():
                    last = parse_view(line)
                if last is not None:
                    # A keepalive says the view still holds: it is applied again, since this
                    # agent counts its own forwards into its copy (``choose``) and a failed
                    # forward empties it (``forward``); the peer says only what it changed.
                    self._seen(url, last)

    def _seen(self, url: str, view: PeerView) -> None:
        peer = self.peers.get(url)
        if peer is None:  # it left the peer set meanwhile
            return
        models_max, models, needs, free = view
        # Copies: ``choose`` edits them until the next line.
        peer.models_max, peer.models, peer.needs = models_max, dict(models), needs
        peer.free = dict(free) if free is not None else None
        if not peer.reachable:
            log.info("peer %s answers (%d models)", url, len(peer.models))
        peer.reachable, peer.error = True, None

    def _lost(self, url: str, error: str) -> None:
        peer = self.peers.get(url)
        if peer is None:
            return
        if peer.reachable:
            log.warning("peer %s does not answer, left out: %s", url, error)
        elif peer.error is None:  # never reached yet: peers start together
            log.info("peer %s does not answer yet: %s", url, error)
        peer.reachable, peer.models, peer.error = False, {}, error

    def choose(self, name: str, request: web.Request) -> Choice:
        """Where the request for ``name`` is served (the pure core decides)."""
        sched = self._registry.scheduler
        views = {n: sched.view(n) for n in self._registry.specs()}
        states = {n: effective_state(v.state.value, v.queued) for n, v in views.items()}
        mine = views[name]
        memory = self._registry.memory
        here = Node(
            peer=None,
            state=states[name],
            queue=mine.in_flight + mine.queued,
            fits=fits(
                list(states.values()),
                self._models_max,
                dict(memory.ledger.figures(name).min) if memory is not None else None,
                free_memory(memory.statistics()) if memory is not None else None,
            ),
        )
        peers = [
            Node(
                peer=p.url,
                state=p.models[name][0],
                queue=p.models[name][1],
                fits=fits(
                    [state for state, _ in p.models.values()],
                    p.models_max,
                    p.needs.get(name),
                    p.free,
                ),
            )
            for p in self.peers.values()
            if p.reachable and name in p.models
        ]
        choice = choose(here, peers, forwarded=FORWARDED in request.headers)
        if choice.peer is not None:
            # Until its next view, count what was just sent there: the next requests for this
            # model follow it, and a peer given a model to load is no longer one that fits.
            peer = self.peers[choice.peer]
            state, queue = peer.models[name]
            peer.models[name] = (state if state in RESIDENT else LOADING, queue + 1)
            need = peer.needs.get(name)
            if state not in RESIDENT and need is not None and peer.free is not None:
                peer.free = {
                    d: f if f is None else f - need.get(d, 0) for d, f in peer.free.items()
                }
        return choice

    async def forward(
        self, request: web.Request, peer: str, body: bytes | None
    ) -> web.StreamResponse:
        """Send ``request`` to ``peer`` in one hop; its answer streams back as it comes."""
        headers = {FORWARDED: self.agent_id, **self._auth}
        try:
            return await self._proxy.forward_to(request, self._target(peer), body, headers)
        except ApiError:
            # It did not answer, or died mid-answer: the client gets the 502; the requests
            # after it do not wait for its subscription to break to stop going there.
            state = self.peers.get(peer)  # (None: it left the peer set meanwhile)
            if state is not None:
                state.reachable, state.models = False, {}
                state.error = "a forwarded request failed"
            log.warning("peer %s failed a forwarded request: left out until it answers", peer)
            raise

    def _target(self, url: str) -> Target:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        return Target(
            parts.hostname or "",
            parts.port or (443 if https else 80),
            self._tls if https else None,
            self._server_name,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def free_memory(ledger: Mapping[str, Any]) -> dict[str, int | None]:
    """Bytes a new load may use per device, margin deducted (None: no limit there), from the
    ledger's ``GET /ledger`` body (``MemoryWatch.statistics()``)."""
    return {
        str(d["name"]): None if d["available"] is None else int(d["available"]) - int(d["margin"])
        for d in ledger["devices"]
    }
