"""The agent's peers (``--peer URL``, ``--peers-from-service``): what each one has loaded, and
one-hop forwarding to it.

A background task polls every peer's ``GET /models`` and ``GET /props`` each second with the
agent's own ``--api-key`` (one key cluster-wide): per peer, whether it answered, and per model
its state and queue depth (``corral.in_flight`` + ``corral.queued``) and whether it has a free
``--models-max`` slot; where the peer's memory ledger is on, each model's ``min`` (its
``corral.memory``) and the peer's free memory per device (``GET /ledger?probe=0``: as of its
last device reading, so that polls do not probe its devices each second), so that "fits with no
eviction" means a free slot and the memory for it. A peer that fails a poll drops out until it
answers again. Which node
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
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from node_agent.api.proxy import Proxy
from node_agent.core.peer_rank import LOADING, RESIDENT, Choice, Node, choose, effective_state, fits
from node_agent.errors import ApiError
from node_agent.runtime.registry import Registry

log = logging.getLogger("corral.peers")

FORWARDED = "X-Corral-Forwarded"
POLL_SECONDS = 1.0
POLL_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


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
    ) -> None:
        self.agent_id = agent_id
        self._given = tuple(urls)  # --peer: always peers; discovered ones come and go
        self.peers = {url: PeerState(url) for url in urls}
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._registry = registry
        self._models_max = models_max
        self._proxy = proxy
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # As the proxy's own sessions: the peer's bytes go to the client as they are, and
            # no connection limit here (aiohttp's default is 100): the peer's own gate limits.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    def use_discovered(self, urls: Sequence[str]) -> None:
        """The peer set is now ``--peer``'s and these (``api/peer_discovery.py``): a peer
        still there keeps its view, a new one is polled from the next round, a gone one is
        dropped (a request already forwarded to it finishes or fails on its own)."""
        wanted = dict.fromkeys((*self._given, *urls))
        added = [url for url in wanted if url not in self.peers]
        gone = [url for url in self.peers if url not in wanted]
        self.peers = {url: self.peers.get(url) or PeerState(url) for url in wanted}
        if added or gone:
            log.info("peers: %d (added %s; gone %s)", len(self.peers), added or "-", gone or "-")

    async def run(self) -> None:
        """Poll every peer each second, for as long as the agent runs."""
        while True:
            await asyncio.gather(*(self._poll(peer) for peer in self.peers.values()))
            await asyncio.sleep(POLL_SECONDS)

    async def _poll(self, peer: PeerState) -> None:
        from node_agent.models_schema import parse_entries  # pydantic: lazily (start-up time)

        try:
            models = await self._get(peer.url + "/models")
            props = await self._get(peer.url + "/props")
            entries, _ = parse_entries(models)
            peer.models = {
                name: (
                    (
                        effective_state(e.status.value, e.corral.queued),
                        e.corral.in_flight + e.corral.queued,
                    )
                    if e.corral is not None
                    else (e.status.value, 0)
                )
                for name, e in entries.items()
            }
            peer.models_max = int(props.get("max_instances", 0))
            peer.needs = {
                name: dict(e.corral.memory.min)
                for name, e in entries.items()
                if e.corral is not None and e.corral.memory is not None
            }
            ledger = await self._get(peer.url + "/ledger?probe=0") if peer.needs else None
            peer.free = free_memory(ledger) if ledger is not None else None
        except (aiohttp.ClientError, TimeoutError, ValueError, TypeError, KeyError) as exc:
            if peer.reachable:
                log.warning("peer %s does not answer, left out: %s", peer.url, exc or type(exc))
            elif peer.error is None:  # never reached yet: peers start together
                log.info("peer %s does not answer yet: %s", peer.url, exc or type(exc))
            peer.reachable, peer.models, peer.error = False, {}, str(exc) or type(exc).__name__
            return
        if not peer.reachable:
            log.info("peer %s answers (%d models)", peer.url, len(peer.models))
        peer.reachable, peer.error = True, None

    async def _get(self, url: str) -> Any:
        async with self._client().get(url, headers=self._auth, timeout=POLL_TIMEOUT) as answer:
            if answer.status != 200:
                raise ValueError(f"GET {urlsplit(url).path} answered {answer.status}")
            return await answer.json(content_type=None)

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
            # Until the next poll, count what was just sent there: the next requests for this
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
        port = urlsplit(peer).port or 0
        try:
            return await self._proxy.forward_to(self._client(), request, peer, port, body, headers)
        except ApiError:
            # It did not answer, or died mid-answer: the client gets the 502; the requests
            # after it do not wait for the next poll to stop going there.
            state = self.peers.get(peer)  # (None: it left the peer set meanwhile)
            if state is not None:
                state.reachable, state.models = False, {}
                state.error = "a forwarded request failed"
            log.warning("peer %s failed a forwarded request: left out until it answers", peer)
            raise

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def free_memory(ledger: Mapping[str, Any]) -> dict[str, int | None]:
    """Bytes a new load may use per device, margin deducted (None: no limit there), from the
    ledger's ``GET /ledger`` body (``MemoryWatch.statistics()``), this agent's or a peer's."""
    return {
        str(d["name"]): None if d["available"] is None else int(d["available"]) - int(d["margin"])
        for d in ledger["devices"]
    }
