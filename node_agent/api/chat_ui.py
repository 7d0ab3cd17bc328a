"""llama.cpp's chat web UI at ``/``, served from the llama-server binary in use.

llama-server embeds its UI (a static Svelte build: ``index.html`` and hashed ``_app/…``
assets, gzip-compressed) and its router serves it at ``/``. The asset table lives inside the
binary's code and has no file format of its own, so rather than parse a binary the agent asks
the binary itself: a short-lived *UI server* — that binary in router mode, on the loopback, over
an empty models folder, so it can never load anything — answers the first request for each
asset; the answer is kept in memory (the assets of one binary never change), and the UI server
exits once nobody asked it anything for :data:`IDLE_SECONDS`. Offline, no build step, always
the UI of the binary whose children answer it. A binary built without its UI (``/`` is 404
there, as with ``corral llama-server build`` without ``--ui``) falls back to the UI of a build
in Corral's cache that has one (``--ui``), else ``/`` leads to Corral's status page.

The UI's own requests (``/models``, ``/models/load``, ``/v1/chat/completions`` with
``X-Conversation-Id``, ``/v1/stream``) reach the agent like any client's. ``/`` gets a link to
Corral's status page (``/ui``) injected at the end of its body.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import secrets
import string
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from node_agent.aio import TaskSet
from node_agent.child.pdeathsig import make_preexec
from node_agent.child.ports import CHILD_HOST, release_port, reserve_port
from node_agent.llama_server.cache import builds, cache_root

log = logging.getLogger("corral.chat_ui")

IDLE_SECONDS = 60.0  # the UI server exits after this long without a question
START_SECONDS = 30.0  # how long it may take to answer /health
FETCH_SECONDS = 30.0
# A UI file's path: short, in the characters a Svelte build names its files with. Checked on the
# path as the client sent it, so what reaches the UI server is exactly that: no decoded `%3F`
# that became a query (`/%3Fx.js` was its index.html, `/health%3F.x` its /health: issue 26,
# rows 7 and 19). It answers any other path 401 (its key nobody knows), so only its own files
# are 200s, and only 200s are kept: the cache holds the binary's files, no more (and the bounds
# below hold even if a binary answered 200 to everything).
MAX_PATH = 256
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
MAX_ASSETS = 512
MAX_ASSET_BYTES = 64 * 1024 * 1024
# Its answer headers that say what the bytes are and how to cache them; the rest are its own.
_KEPT = (
    "Content-Type",
    "Content-Encoding",
    "ETag",
    "Cache-Control",
    "Cross-Origin-Embedder-Policy",
    "Cross-Origin-Opener-Policy",
)
# Framing the UI (clickjacking its load and delete buttons) and plugins are refused. Scripts are
# not restricted: the UI boots from an inline script and talks to the MCP servers a user adds.
SECURITY_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'; object-src 'none'; base-uri 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
STATUS_LINK = (
    b'<a href="/ui" title="Corral: models, memory, events" style="position:fixed;right:8px;'
    b"bottom:8px;z-index:99999;font:12px sans-serif;padding:2px 6px;border-radius:4px;"
    b'background:#fff8;color:#333;text-decoration:none">Corral status</a>'
)


@dataclass(frozen=True)
class Asset:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes  # as the UI server sent it (gzip-compressed where it says so)

    @property
    def gzipped(self) -> bool:
        return any(k == "Content-Encoding" and v == "gzip" for k, v in self.headers)


def with_status_link(asset: Asset) -> Asset:
    """``index.html`` with a link to Corral's status page before ``</body>``."""
    html = gzip.decompress(asset.body) if asset.gzipped else asset.body
    at = html.rfind(b"</body>")
    if at < 0:
        return asset
    html = html[:at] + STATUS_LINK + html[at:]
    headers = tuple((k, v) for k, v in asset.headers if k != "ETag")  # not its bytes any more
    body = gzip.compress(html, mtime=0) if asset.gzipped else html
    return Asset(asset.status, headers, body)


class KeptAssets:
    """The UI's files by path, as first answered (one binary's never change): at most
    ``max_assets`` of them and ``max_bytes`` in all; past that a file is served, not kept."""

    def __init__(self, max_assets: int = MAX_ASSETS, max_bytes: int = MAX_ASSET_BYTES) -> None:
        self._assets: dict[str, Asset] = {}
        self._bytes = 0
        self._max_assets = max_assets
        self._max_bytes = max_bytes

    def get(self, path: str) -> Asset | None:
        return self._assets.get(path)

    def keep(self, path: str, asset: Asset) -> None:
        full = len(self._assets) >= self._max_assets
        if path in self._assets or full or self._bytes + len(asset.body) > self._max_bytes:
            return
        self._assets[path] = asset
        self._bytes += len(asset.body)

    def statistics(self) -> dict[str, int]:
        return {"assets": len(self._assets), "bytes": self._bytes}


class UiServer:
    """One binary's UI server, started on demand and stopped when idle (one owner: a lock)."""

    def __init__(self, binary: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.binary = binary
        self._clock = clock
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._port: int | None = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._used = 0.0

    async def fetch(self, session: aiohttp.ClientSession, path: str) -> Asset:
        async with self._lock:
            port = await self._ensure(session)
            self._used = self._clock()
        url = f"http://{CHILD_HOST}:{port}{path}"
        async with session.get(url, headers={"Accept-Encoding": "gzip"}) as answer:
            body = await answer.read()
            headers = tuple((k, answer.headers[k]) for k in _KEPT if k in answer.headers)
            return Asset(answer.status, headers, body)

    async def _ensure(self, session: aiohttp.ClientSession) -> int:
        if self._proc is not None and self._proc.returncode is None and self._port is not None:
            return self._port
        await self._stop()
        self._folder = tempfile.TemporaryDirectory(prefix="corral-ui-")
        self._port = reserve_port()
        # LLAMA_ARG_* of the agent's environment would reach it as options (a model to load).
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
        # A key nobody knows: its UI files stay public (llama.cpp's rule), every other endpoint
        # of this helper (its POST /models downloads…) answers 401 to whatever else is local.
        key = secrets.token_urlsafe(24)
        args = ["--host", CHILD_HOST, "--port", str(self._port), "--api-key", key]
        self._proc = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            "--models-dir",
            self._folder.name,
            "--no-models-autoload",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            preexec_fn=make_preexec(),
        )
        log.info(
            "started the UI server of %s (pid %d, port %d)", self.binary, self._proc.pid, self._port
        )
        deadline = self._clock() + START_SECONDS
        while self._clock() < deadline and self._proc.returncode is None:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://{CHILD_HOST}:{self._port}/health") as health:
                    if health.status == 200:
                        return self._port
            await asyncio.sleep(0.05)
        await self._stop()
        raise OSError(f"{self.binary} in router mode did not answer /health")

    async def stop_if_idle(self, idle: float) -> None:
        async with self._lock:
            if self._proc is not None and self._clock() - self._used >= idle:
                await self._stop()

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            log.info("stopped the UI server of %s (idle)", self.binary)
        release_port(self._port)
        self._port = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    async def close(self) -> None:
        async with self._lock:
            await self._stop()


class ChatUi:
    """The UI's assets by path: asked of the first binary that has a UI, then kept."""

    def __init__(self, binaries: list[str]) -> None:
        self._servers = [UiServer(b) for b in dict.fromkeys(binaries)]  # in order, once each
        self._assets = KeptAssets()
        self._chosen: UiServer | None = None
        self._none = False  # no binary has a UI
        self._session: aiohttp.ClientSession | None = None
        self._tasks = TaskSet("chat-ui")

    async def asset(self, path: str) -> Asset | None:
        """The UI's answer for ``path`` (None: no binary has a UI)."""
        kept = self._assets.get(path)
        if kept is not None:
            return kept
        server = await self._server()
        if server is None or self._session is None:
            return None
        asset = await server.fetch(self._session, path)
        if path == "/" and asset.status == 200:
            asset = with_status_link(asset)
        if asset.status == 200:
            self._assets.keep(path, asset)  # only files: a path probed at random is not kept
        return asset

    async def _server(self) -> UiServer | None:
        if self._chosen is not None or self._none or self._session is None:
            return self._chosen
        for server in self._servers:
            try:
                index = await server.fetch(self._session, "/")
            except (OSError, aiohttp.ClientError) as exc:
                log.warning("no chat UI from %s: %s", server.binary, exc)
                continue
            if index.status == 200:
                log.info("the chat UI at / is the one of %s", server.binary)
                self._chosen = server
                return server
            log.info("%s has no chat UI (its / answers %d)", server.binary, index.status)
            await server.close()
        self._none = True
        log.warning("no llama-server binary here has a chat UI: / shows Corral's status page")
        return None

    async def _expire(self) -> None:
        while True:
            await asyncio.sleep(IDLE_SECONDS / 4)
            for server in self._servers:
                await server.stop_if_idle(IDLE_SECONDS)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=FETCH_SECONDS)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._tasks.spawn(self._expire(), "idle", forever=True)
        yield
        await self._tasks.close()
        for server in self._servers:
            await server.close()
        await self._session.close()


def is_ui_path(path: str) -> bool:
    """What the UI's own files look like: ``/``, ``/index.html``, ``/_app/…``, and files at the
    top level with an extension (``/favicon.svg``, ``/manifest.webmanifest``, ``/sw.js``), each
    name made of letters, digits, ``.``, ``_`` and ``-`` and not starting with a dot."""
    if path == "/":
        return True
    if len(path) > MAX_PATH or not path.startswith("/"):
        return False
    names = path[1:].split("/")
    if not all(name and name[0] != "." and _NAME_CHARS.issuperset(name) for name in names):
        return False
    if names[0] == "_app":
        return len(names) > 1
    return len(names) == 1 and "." in names[0]


def _answer(asset: Asset, request: web.Request) -> web.Response:
    headers = dict(asset.headers)
    body = asset.body
    if asset.gzipped and "gzip" not in request.headers.get("Accept-Encoding", ""):
        body = gzip.decompress(body)  # llama.cpp answers such a client 415; we unpack it
        headers.pop("Content-Encoding")
    headers.update(SECURITY_HEADERS)
    return web.Response(status=asset.status, body=body, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHAT_UI: web.AppKey[ChatUi] = web.AppKey("corral_chat_ui", ChatUi)


@web.middleware
async def serve_chat_ui(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The UI's files, for GETs that no route of Corral's matched. A middleware, not routes:
    the file names are known only to the binary. Before the API key check, like llama.cpp:
    the UI is public (it asks for the key itself)."""
    unmatched = isinstance(request.match_info.http_exception, web.HTTPNotFound)
    path = request.rel_url.raw_path  # as sent: a %-escape is never a UI file's
    if request.method not in ("GET", "HEAD") or not unmatched or not is_ui_path(path):
        return await handler(request)
    asset = await request.app[CHAT_UI].asset(path)  # its query is not the UI server's
    if asset is None:
        if path == "/":
            raise web.HTTPFound("/ui")
        raise web.HTTPNotFound()
    return _answer(asset, request)


def setup_chat_ui(app: web.Application, binary: str) -> None:
    """Serve the chat UI of ``binary``, else of a build with the UI in Corral's cache (call
    from build_app, with :func:`serve_chat_ui` among the app's middlewares)."""
    with_ui = [str(b.binary) for b in builds(cache_root(os.environ)) if b.ui]
    chat_ui = app[CHAT_UI] = ChatUi([binary, *with_ui])
    app.cleanup_ctx.append(chat_ui.lifecycle)
