"""The proxy (api/proxy.py) over its own HTTP/1.1 client (api/wire.py), between a real aiohttp
server for the client's side and a scripted upstream on loopback: defects found in review."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from node_agent.api.proxy import MAX_POOLS, Proxy
from node_agent.api.wire import Target

pytestmark = pytest.mark.timeout(20)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[int]:
    """The agent's side: an aiohttp server whose one route is ``handler``; yields its port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@asynccontextmanager
async def scripted(
    play: Callable[[bytes, asyncio.StreamWriter], Awaitable[None]], host: str = "127.0.0.1"
) -> AsyncIterator[int]:
    """The upstream (a child or a peer): reads one request head and plays ``play`` for it,
    then holds the connection open until the test ends."""
    ended = asyncio.Event()
    plays: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        plays.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await play(await reader.readuntil(b"\r\n\r\n"), writer)
            await ended.wait()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        ended.set()
        await asyncio.gather(*plays, return_exceptions=True)
        server.close()
        await server.wait_closed()


def event_chunk(size: int) -> bytes:
    event = b"data: " + b"x" * size + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


async def test_a_client_that_stops_reading_as_a_stream_ends_is_cut_off_too() -> None:
    """``--client-timeout`` bounds ``writer.drain()`` only for a pause mid-stream. When the
    read that ends the stream is the one that fills the client's buffer, the sink does not
    ask for a pause (``_hand_on``: ``and not self._done``) and ``_stream`` goes on to
    ``response.write_eof()``, whose drain has no bound: the handler (and in the agent the
    lease, the child's slot) is held for as long as the client stays connected."""

    async def child(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(event_chunk(60_000))  # the client's buffer: under 64 KiB, no pause
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(event_chunk(30_000) + b"0\r\n\r\n")  # past it, and the end
        await writer.drain()

    proxy = Proxy(timeout=5.0, client_timeout=0.3)
    returned = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        # Small kernel buffers towards the client, so its unread bytes stay in the transport.
        assert request.transport is not None
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        try:
            return await proxy.forward(request, child_port, None)
        finally:
            returned.set()

    async with scripted(child) as child_port, serving(handler) as agent_port:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", agent_port))
            client.send(b"GET /stream HTTP/1.1\r\nHost: agent\r\n\r\n")  # and never reads
            try:
                await asyncio.wait_for(returned.wait(), 3.0)  # 10 times --client-timeout
            except TimeoutError:
                pytest.fail("the handler still waits on a client that stopped reading")
        finally:
            client.close()
            await proxy.close()


async def test_a_peer_on_an_ipv6_address_gets_a_host_header_in_brackets() -> None:
    """``_relay`` writes ``Host: {host}:{port}``: for an IPv6 peer (``https://[fd00::5]:8080``,
    ``core/endpoint_slices.py`` makes such URLs, ``Peers._target`` strips the brackets) that
    is ``Host: fd00::5:8080``, which RFC 9110 §7.2 / RFC 3986 do not allow; aiohttp's client
    sent ``[fd00::5]:8080``. The peer's ``--allowed-hosts`` check and ``request.url`` (yarl:
    "port can't be converted to integer") choke on it."""
    heads: list[bytes] = []

    async def peer(head: bytes, writer: asyncio.StreamWriter) -> None:
        heads.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    proxy = Proxy(timeout=5.0)
    async with scripted(peer, host="::1") as peer_port:

        async def handler(request: web.Request) -> web.StreamResponse:
            return await proxy.forward_to(request, Target("::1", peer_port), None, {})

        async with serving(handler) as agent_port:
            reader, writer = await asyncio.open_connection("127.0.0.1", agent_port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
    await proxy.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    host = next(line for line in heads[0].split(b"\r\n") if line.lower().startswith(b"host:"))
    assert host == b"Host: [::1]:%d" % peer_port


async def test_peer_pools_are_dropped_once_their_connections_are_gone() -> None:
    """Each peer address gets a pool: with pods coming and going on new IPs, pools without a
    connection must go (found in review: children's were dropped past MAX_POOLS, peers'
    never were, so the dict grew for the agent's life)."""

    async def peer(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()  # as it said

    proxy = Proxy(timeout=5.0)
    peers = MAX_POOLS + 6
    async with scripted(peer) as peer_port:

        async def handler(request: web.Request) -> web.StreamResponse:
            # Many "peers" (one server: the target's name differs, as pods' IPs do).
            target = Target("127.0.0.1", peer_port, server_hostname=f"pod-{request.path}")
            return await proxy.forward_to(request, target, None, {})

        async with serving(handler) as agent_port:
            for i in range(peers):
                reader, writer = await asyncio.open_connection("127.0.0.1", agent_port)
                writer.write(b"GET /%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" % i)
                assert (await reader.read()).startswith(b"HTTP/1.1 200")
                writer.close()
    stats = proxy.statistics()
    await proxy.close()
    assert (stats.busy, stats.idle) == (0, 0)
    assert stats.targets <= MAX_POOLS, stats
