"""A child for fast tests of the async layer: a real HTTP server in this process, no llama-server.

It goes through the registry's own seam (``ChildFactory``) and answers the way llama-server does
where the registry and the proxy can tell: it reports the same events as ``ChildProcess``
(spawned, ready, stopping, exited: expected or not, with the exit code), takes only requests
that carry the child's own key, a streamed chat sends one SSE chunk every few ms until the
client has enough or the child exits; ``stop()`` waits for the streams in flight (up to the
stop timeout: llama-server finishes its generations before it obeys the exit command) and
``stop(now=True)`` drops them at once (SIGKILL). What each model does is set in a :class:`Plan`.
``tests/integration/test_child_conformance.py`` holds it to the real child on the same cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from node_agent.api.app import build_app
from node_agent.api.proxy import Proxy
from node_agent.api.state import AgentState, RouterSettings
from node_agent.child.keys import child_key
from node_agent.child.logs import LogRing
from node_agent.child.state import ChildEvent, ChildState, EventKind
from node_agent.runtime.registry import Registry
from node_agent.sources.catalog import Catalog
from node_agent.sources.spec import ModelSpec

TOKEN_EVERY = 0.005  # seconds between two streamed chunks
_PIDS = itertools.count(900_000)


@dataclass
class Plan:
    """What the fake children do, and what they did (for the test's asserts)."""

    ready_after: float = 0.0  # seconds from spawn to ready
    spawn_after: float = 0.0  # seconds before the "process" exists (a slow fork/exec)
    fail_start: str | None = None  # start() raises this once spawned (a failed load)
    spawn_fails: str | None = None  # start() raises this before any process exists
    stall: bool = False  # takes chat requests and never answers them (/health stays ok)
    status: int | None = None  # answers every chat with this error status
    token_every: float = TOKEN_EVERY  # seconds between two streamed chunks
    cut_mid_event: bool = False  # a stream's connection drops in the middle of its third event
    spawned: list[str] = field(default_factory=list)  # model names, in spawn order
    exited: dict[str, float] = field(default_factory=dict)  # model -> monotonic exit time
    children: list[FakeChild] = field(default_factory=list)
    conversations: list[str] = field(default_factory=list)  # X-Conversation-Id of each chat

    def factory(self, spec: ModelSpec, events: Callable[[ChildEvent], None]) -> FakeChild:
        child = FakeChild(spec, events, self)
        self.children.append(child)
        return child


class FakeChild:
    """One fake llama-server: ``start`` binds a port and serves, ``stop`` drops every
    connection and exits (code 0)."""

    def __init__(self, spec: ModelSpec, events: Callable[[ChildEvent], None], plan: Plan) -> None:
        self.spec = spec
        self.events = events
        self.plan = plan
        self._port: int | None = None
        self._pid: int | None = None
        self._runner: web.AppRunner | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._streams: set[web.StreamResponse] = set()
        self._idle = asyncio.Event()  # no stream in flight
        self._idle.set()
        self._stopping = False
        self.sockets = 0  # WebSocket sessions open now
        self.meta: dict[str, Any] | None = None

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def logs(self) -> LogRing | None:
        return None

    def kill(self) -> None:
        self.crash()

    def _emit(self, kind: EventKind, state: ChildState, **extra: Any) -> None:
        self.events(ChildEvent(self.spec.name, kind, state, self._pid, self._port, **extra))

    async def start(self) -> None:
        if self.plan.spawn_after:
            await asyncio.sleep(self.plan.spawn_after)
        if self.plan.spawn_fails is not None:
            self._exited.set_result(127)
            raise RuntimeError(self.plan.spawn_fails)
        app = web.Application(client_max_size=64 * 1024 * 1024)  # llama-server's bodies: large
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/slots", self._slots)
        app.router.add_post("/completion", self._completion)
        app.router.add_get("/v1/realtime", self._realtime)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.05)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._pid = next(_PIDS)
        self.plan.spawned.append(self.spec.name)
        self._emit(EventKind.SPAWNED, ChildState.STARTING)
        if self.plan.ready_after:  # loading; a stop meanwhile ends it, as llama-server's kill
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), self.plan.ready_after)
        if self._exited.done():
            raise RuntimeError(f"model {self.spec.name}: stopped while loading")
        if self.plan.fail_start is not None:
            await self._exit(1)
            raise RuntimeError(self.plan.fail_start)
        self.meta = {"id": self.spec.name}
        self._emit(EventKind.READY, ChildState.READY, meta=self.meta)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _slots(self, request: web.Request) -> web.Response:
        """The agent's probe of its main loop: stuck in a stalled child, as llama-server's."""
        if self.plan.stall:
            await asyncio.Event().wait()
        return web.json_response([{"id": 0, "is_processing": bool(self._streams)}])

    async def _completion(self, request: web.Request) -> web.Response:
        """The agent's one-token probe: a child that fails every request fails it too."""
        if self.plan.status is not None:
            error = {"code": self.plan.status, "message": "it broke", "type": "server_error"}
            return web.json_response({"error": error}, status=self.plan.status)
        return web.json_response({"content": "x"})

    async def _realtime(self, request: web.Request) -> web.StreamResponse:
        """A WebSocket that echoes (b11434 has none: a stub of what a child may serve)."""
        assert self._port is not None
        if request.headers.get("Authorization") != f"Bearer {child_key(self._port)}":
            return web.json_response({"error": "no key"}, status=401)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets += 1
        try:
            async for message in ws:
                if message.type is aiohttp.WSMsgType.TEXT:
                    await ws.send_str(f"echo: {message.data}")
                elif message.type is aiohttp.WSMsgType.BINARY:
                    await ws.send_bytes(message.data[::-1])
        finally:
            self.sockets -= 1
        return ws

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        assert self._port is not None
        if request.headers.get("Authorization") != f"Bearer {child_key(self._port)}":
            error = {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
            return web.json_response({"error": error}, status=401)
        body = await request.json()
        if "X-Conversation-Id" in request.headers:
            self.plan.conversations.append(request.headers["X-Conversation-Id"])
        if self.plan.stall:
            await asyncio.Event().wait()  # a wedged child: alive, healthy, silent
        if self.plan.status is not None:
            error = {"code": self.plan.status, "message": "it broke", "type": "server_error"}
            return web.json_response({"error": error}, status=self.plan.status)
        tokens = int(body.get("max_tokens", 4))
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": "x" * tokens}}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self._streams.add(response)
        self._idle.clear()
        try:
            for i in range(tokens):
                chunk = {"choices": [{"delta": {"content": "x"}}]}
                event = f"data: {json.dumps(chunk)}\n\n".encode()
                if self.plan.cut_mid_event and i == 2:
                    await response.write(event[:20])  # as a process killed mid-write
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                await response.write(event)
                await asyncio.sleep(self.plan.token_every)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        finally:
            self._streams.discard(response)
            if not self._streams:
                self._idle.set()
        return response

    async def _exit(self, code: int) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            # An exiting llama-server drops its connections, streams and all.
            for stream in list(self._streams):
                transport = stream._req.transport if stream._req is not None else None
                if transport is not None:
                    transport.abort()
            await runner.cleanup()
        if not self._exited.done():
            self.plan.exited[self.spec.name] = time.monotonic()
            self._exited.set_result(code)
            expected = self._stopping
            self._emit(EventKind.EXITED, ChildState.EXITED, exit_code=code, expected=expected)

    async def stop(self, *, now: bool = False) -> int | None:
        if self._pid is None and self._runner is None:
            if not self._exited.done():
                self._exited.set_result(0)
            return None
        self._stopping = True
        self._emit(EventKind.STOPPING, ChildState.STOPPING)
        if not now:
            # As llama-server does: the exit command waits for the generations in flight
            # (ChildProcess kills it after its stop timeout).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self.spec.stop_timeout)
        await self._exit(0)
        return await self._exited

    async def wait_exited(self) -> int:
        return await asyncio.shield(self._exited)

    def crash(self) -> None:
        """Die now, from outside (a SIGKILL)."""
        asyncio.get_running_loop().create_task(self._exit(-9))


def spec(name: str, **extra: Any) -> ModelSpec:
    """A model spec as a preset would give it (stop timeout and all)."""
    return ModelSpec(name=name, source="preset", **extra)


@dataclass
class Agent:
    """A registry, a proxy and the real HTTP app on a free port, with fake children."""

    registry: Registry
    proxy: Proxy
    catalog: Catalog
    url: str
    client: aiohttp.ClientSession


@asynccontextmanager
async def fake_agent(
    plan: Plan,
    specs: Iterator[ModelSpec] | list[ModelSpec],
    *,
    proxy_timeout: float = 30.0,
    **registry_args: Any,
) -> AsyncIterator[Agent]:
    catalog = Catalog({s.name: s for s in specs})
    registry_args.setdefault("models_max", 4)
    registry_args.setdefault(
        "probe_timeout", proxy_timeout
    )  # the agent's --timeout, as in agent.py
    proxy = Proxy(timeout=proxy_timeout)
    registry = Registry(
        catalog,
        child_factory=plan.factory,
        release_port=proxy.release_port,
        **registry_args,
    )
    settings = RouterSettings(
        models_max=registry_args["models_max"],
        models_autoload=True,
        api_keys=(),
        build_info="test",
    )

    async def no_reload() -> None:
        return None

    app = build_app(AgentState(registry, proxy, settings, no_reload, "llama-server"))
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    registry.start()
    try:
        async with aiohttp.ClientSession() as client:
            yield Agent(registry, proxy, catalog, f"http://127.0.0.1:{port}", client)
    finally:
        await registry.close()
        await proxy.close()
        await runner.cleanup()


def chat(model: str, tokens: int = 4, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }
