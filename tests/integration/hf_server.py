"""A local, offline Hugging Face Hub: the endpoints llama.cpp's downloader calls, nothing more.

``GET /api/models/<repo>/refs`` (the branches and their commits), ``GET /api/models/<repo>/tree/
<commit>?recursive=true`` (files with their LFS oid and size), ``HEAD``/``GET /<repo>/resolve/
<commit>/<path>`` (the bytes, with ``ETag``, ``Content-Length``, ``Accept-Ranges`` and ``Range``
answered with 206), as llama.cpp b11434's ``common/hf-cache.cpp`` and ``common/download.cpp``
read them. Both llama.cpp's router (``MODEL_ENDPOINT``) and Corral's agent download from it.

Tests steer it: :meth:`HubServer.hold` stops every body after some bytes until
:meth:`HubServer.release` (a download "on its way"), ``pace`` makes bodies trickle,
``redirect`` answers a resolve with a 302 elsewhere, ``endless`` streams a body that never
ends, ``token`` makes every call need ``Authorization: Bearer <token>``; for attacks on the
downloader, ``declared`` lists other sizes than the files', ``claim_length`` sends that
``Content-Length`` and then bytes until the client goes, ``unsized`` lists no size and sends
no length, ``split_listing`` sends a tree listing in two writes that many seconds apart.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

CHUNK = 64 * 1024
PACED_CHUNK = 16 * 1024


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubServer:
    """The hub's content and switches; :func:`start_hub` serves it on 127.0.0.1."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    hold_after: int | None = None  # bytes of each body sent before waiting for release()
    redirect: str | None = None  # a resolve answers 302 to this URL + the file's path
    endless: bool = False  # resolve bodies never end (and declare no length)
    pace: float | None = None  # seconds between 16 KiB pieces: a download that trickles
    token: str | None = None  # when set, calls without "Bearer <token>" get 401
    declared: dict[str, int] = field(default_factory=dict)  # file -> the size the tree lists
    claim_length: int | None = None  # a resolve's Content-Length; then bytes until closed
    unsized: bool = False  # the tree lists no size (no LFS), a resolve sends no length
    split_listing: float | None = None  # seconds between a tree listing's two halves
    _gate: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    url: str = ""

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = dict(files)

    @staticmethod
    def commit(repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def hold(self, after: int) -> None:
        self._gate.clear()
        self.hold_after = after

    def release(self) -> None:
        self.hold_after = None
        self._gate.set()

    def resolves(self) -> list[Request]:
        return [r for r in self.requests if "/resolve/" in r.path and r.method == "GET"]

    def close(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def start_hub(hub: HubServer | None = None) -> HubServer:
    hub = hub or HubServer()
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    hub._server = server
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, name="hf-hub", daemon=True).start()
    return hub


_REFS = re.compile(r"/api/models/([^/]+/[^/]+)/refs")
_TREE = re.compile(r"/api/models/([^/]+/[^/]+)/tree/([0-9a-f]{40})")
_RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        hub = self.hub
        path = self.path.split("?", 1)[0]
        hub.requests.append(
            Request(
                self.command,
                self.path,
                self.headers.get("Range"),
                self.headers.get("Authorization"),
            )
        )
        if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
            self._json(401, {"error": "Invalid credentials in Authorization header"})
            return
        if m := _REFS.fullmatch(path):
            repo = m.group(1)
            if repo not in hub.repos:
                self._json(404, {"error": "Repository not found"})
                return
            commit = hub.commit(repo)
            self._json(
                200,
                {
                    "branches": [
                        {"name": "main", "ref": "refs/heads/main", "targetCommit": commit}
                    ],
                    "tags": [],
                    "converts": [],
                },
            )
            return
        if m := _TREE.fullmatch(path):
            files = hub.repos.get(m.group(1))
            if files is None:
                self._json(404, {"error": "Repository not found"})
                return
            tree: list[dict[str, Any]] = []
            for name, data in sorted(files.items()):
                size = hub.declared.get(name, len(data))
                entry: dict[str, Any] = {
                    "type": "file",
                    "path": name,
                    "oid": hashlib.sha1(data).hexdigest(),
                }
                if not hub.unsized:
                    entry["size"] = size
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size}
                tree.append(entry)
            self._json(200, tree, split=hub.split_listing)
            return
        if m := _RESOLVE.fullmatch(path):
            files = hub.repos.get(m.group(1))
            # The Hub decodes the path, as the downloader quotes it (a space, a NUL: %20, %00).
            data = files.get(unquote(m.group(3))) if files is not None else None
            if data is None:
                self._json(404, {"error": "Entry not found"})
                return
            if hub.redirect is not None:
                self.send_response(302)
                self.send_header("Location", hub.redirect + path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._file(data, body=body)
            return
        self._json(404, {"error": "Not found"})

    def _json(self, status: int, value: Any, split: float | None = None) -> None:
        payload = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if split is None:
            self.wfile.write(payload)
            return
        half = len(payload) // 2
        self.wfile.write(payload[:half])
        self.wfile.flush()
        time.sleep(split)
        self.wfile.write(payload[half:])

    def _file(self, data: bytes, *, body: bool) -> None:
        hub = self.hub
        start = 0
        ranged = self.headers.get("Range")
        if ranged and (m := re.fullmatch(r"bytes=(\d+)-", ranged)):
            start = int(m.group(1))
        self.send_response(206 if start else 200)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        if hub.claim_length is not None and body:
            self.send_header("Content-Length", str(hub.claim_length))
            self.end_headers()
            while True:
                try:
                    self.wfile.write(b"\0" * CHUNK)
                except OSError:
                    return
        if hub.unsized and body:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[start:])
            self.close_connection = True
            return
        if hub.endless and body:
            self.send_header("Connection", "close")
            self.end_headers()
            while True:
                try:
                    self.wfile.write(b"\0" * CHUNK)
                except OSError:
                    return
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        sent = start
        while sent < len(data):
            limit = len(data)
            if hub.hold_after is not None and sent >= hub.hold_after:
                hub._gate.wait()
            elif hub.hold_after is not None:
                limit = min(limit, hub.hold_after)
            end = min(sent + (PACED_CHUNK if hub.pace else CHUNK), limit)
            if hub.pace:
                time.sleep(hub.pace)
            if end <= sent:
                continue
            try:
                self.wfile.write(data[sent:end])
                self.wfile.flush()
            except OSError:
                return
            sent = end
