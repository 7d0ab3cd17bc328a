"""What a cluster of N agents costs one agent in peer updates at rest, with N in the hundreds:
one real agent, and N - 1 peers played by one other process (an agent per node of a cluster
this machine cannot hold). Each played peer serves the agent a ``GET /peer-view`` (a view of
40 models, then a keepalive newline every 2 s, as a real one at rest) and subscribes to the
agent's own; the figure is the real agent's CPU seconds per second over a window, once all
its peers are seen and all subscriptions are open.

Issue 25's "each agent's CPU for peer updates" at 500 nodes (``bench/peers_at_rest.py``
measures a few real agents instead). ``--tls``: everything over HTTPS, as the chart runs it
(the agent checks its peers with ``--peer-ca-file`` and ``--peer-server-name``).

    python -m bench.peers_at_scale [--peers 499] [--models 40] [--seconds 30] [--tls]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.peers_at_rest import KEY, answering, cpu_seconds
from bench.procs import REPO, free_port
from node_agent.api.peers import KEEPALIVE, ROUTE
from node_agent.demo_models import write_demo_models
from tests.pki import issue

NAME = "corral-agent.bench.svc"  # the name in the certificate (--tls)


def loopback_hosts(count: int) -> list[str]:
    """``count`` addresses of 127.0.0.0/8 (all of it is this machine's on Linux)."""
    return [f"127.77.{i // 250}.{i % 250 + 1}" for i in range(count)]


class PlayedPeers:
    """N - 1 peers in this process: their views for the agent, their subscriptions to it."""

    def __init__(self, hosts: list[str], port: int, models: int, tls: Path | None) -> None:
        self.hosts, self.port = hosts, port
        listed = {f"peer-model-{i:03}": ["unloaded", 0] for i in range(models)}
        view = {"models_max": 4, "models": listed, "needs": {}, "free": None}
        self.line = json.dumps(view, separators=(",", ":")).encode() + b"\n"
        self.server_tls: ssl.SSLContext | None = None
        self.client_tls: ssl.SSLContext | bool = False
        if tls is not None:
            self.server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.server_tls.load_cert_chain(tls / "tls.crt", tls / "tls.key")
            self.client_tls = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        self.subscribers = 0  # the agent's subscriptions to played peers
        self.following = 0  # played peers' subscriptions to the agent that are open

    async def view(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        self.subscribers += 1
        try:
            await response.write(self.line)
            while True:
                await asyncio.sleep(KEEPALIVE)
                await response.write(b"\n")
        finally:
            self.subscribers -= 1

    async def follow(self, session: aiohttp.ClientSession, url: str) -> None:
        while True:
            try:
                async with session.get(
                    url + ROUTE,
                    headers={"Authorization": f"Bearer {KEY}"},
                    server_hostname=NAME if self.server_tls else None,
                ) as answer:
                    self.following += 1
                    try:
                        async for _ in answer.content.iter_any():
                            pass
                    finally:
                        self.following -= 1
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)

    async def run(self, agent_url: str) -> None:
        app = web.Application()
        app.router.add_get(ROUTE, self.view)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for host in self.hosts:
            await web.TCPSite(runner, host, self.port, ssl_context=self.server_tls).start()
        connector = aiohttp.TCPConnector(limit=0, ssl=self.client_tls)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            asyncio.TaskGroup() as tasks,  # for as long as this process runs
        ):
            for _ in self.hosts:
                tasks.create_task(self.follow(session, agent_url))
            while True:
                await asyncio.sleep(1)
                print(f"{self.subscribers} {self.following}", flush=True)


def played(args: argparse.Namespace) -> int:
    """The played peers' process: prints "<agent's subscriptions> <ours open>" each second."""
    hosts = loopback_hosts(args.peers)
    peers = PlayedPeers(hosts, args.port, args.models, Path(args.tls_dir) if args.tls_dir else None)
    asyncio.run(peers.run(args.agent))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=499, help="played peers (N - 1)")
    parser.add_argument("--models", type=int, default=40, help="models each agent lists")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--tls", action="store_true", help="HTTPS everywhere, as the chart")
    parser.add_argument("--played", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--agent", help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.played:
        return played(args)
    work = Path(tempfile.mkdtemp(prefix="corral-peers-scale-"))
    models = work / "models"
    models.mkdir()
    write_demo_models(models)
    for i in range(args.models - 1):
        (models / f"model-{i:03}.gguf").symlink_to(models / "demo-tiny.gguf")
    scheme, tls_args, tls_dir = "http", [], ""
    if args.tls:
        issue(work, NAME)
        scheme, tls_dir = "https", str(work)
        tls_args = [
            "--ssl-cert-file", str(work / "tls.crt"), "--ssl-key-file", str(work / "tls.key"),
            "--peer-ca-file", str(work / "ca.crt"), "--peer-server-name", NAME,
        ]  # fmt: skip
    # Each played peer on an address of its own and one port, as pods are.
    port, peers_port = free_port(), free_port()
    agent_url = f"{scheme}://127.0.0.1:{port}"
    hosts = loopback_hosts(args.peers)
    peers = [w for host in hosts for w in ("--peer", f"{scheme}://{host}:{peers_port}")]
    agent = subprocess.Popen(
        [sys.executable, "-m", "node_agent.cli", "agent", "--port", str(port),
         "--models-dir", str(models), "--api-key", KEY, "--memory-limit", "host=8GiB",
         *tls_args, *peers],
        cwd=REPO, stdout=(work / "agent.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    fleet = None
    try:
        deadline = time.monotonic() + 120
        while not (args.tls or answering(agent_url)):
            assert time.monotonic() < deadline and agent.poll() is None, "the agent never answered"
            time.sleep(0.2)
        fleet = subprocess.Popen(
            [sys.executable, "-m", "bench.peers_at_scale", "--played", "--peers", str(args.peers),
             "--models", str(args.models), "--port", str(peers_port), "--agent", agent_url,
             "--tls-dir", tls_dir],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert fleet.stdout is not None
        for line in fleet.stdout:  # until the agent follows every peer and every peer it
            subscribed, following = map(int, line.split())
            if subscribed >= args.peers and following >= args.peers:
                break
            if time.monotonic() > deadline or agent.poll() is not None:
                print(f"not all connected: {line.strip()} of {args.peers}", file=sys.stderr)
                return 1
        time.sleep(2 * KEEPALIVE)  # past the first views
        before, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(args.seconds)
        used, seconds = cpu_seconds(agent.pid) - before, time.monotonic() - t0
    finally:
        for proc in (fleet, agent):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print(
        f"1 agent, {args.peers} peers ({'HTTPS' if args.tls else 'HTTP'}), {args.models} models "
        f"each, {seconds:.0f} s at rest: the agent's CPU {used / seconds * 1000:.1f} ms/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
