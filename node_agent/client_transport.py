"""Where the ``corral`` client sends its requests: ``--url`` read as the user means it, and
HTTP over a unix socket for an agent started with ``--host PATH.sock``.

Standard library only, like the client.
"""

from __future__ import annotations

import functools
import http.client
import socket
import urllib.parse
import urllib.request

UNIX_SCHEME = "unix://"  # an agent on a unix socket, as llama-server writes its address


class BadUrl(Exception):
    """``--url`` is not an http(s) URL of a host, nor ``unix://`` and a socket's path."""


def agent_url(text: str) -> str:
    """``--url`` as an http(s) or ``unix://`` URL; a bare ``host:port`` gets ``http://``
    (llama.cpp's users type ``localhost:8080``, which urllib would read as a URL of scheme
    ``localhost``)."""
    url = text.strip()
    if url.startswith(UNIX_SCHEME):
        if len(url) == len(UNIX_SCHEME):
            raise BadUrl(f"--url {text!r} names no socket (e.g. --url unix:///run/corral.sock)")
        return url
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    example = "e.g. --url http://127.0.0.1:8080"
    if parts.scheme not in ("http", "https"):
        raise BadUrl(
            f"--url {text!r}: the agent speaks http://, https:// or unix://, not {parts.scheme}://"
        )
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when it is read
    except ValueError as exc:
        raise BadUrl(f"--url {text!r}: {exc} ({example})") from exc
    if not parts.hostname:
        raise BadUrl(f"--url {text!r} names no host ({example})")
    return url.rstrip("/")


class UnixSocketConnection(http.client.HTTPConnection):
    """HTTP over the unix socket at ``path`` (``host`` only fills the Host header)."""

    def __init__(self, path: str, host: str, timeout: float | None = None) -> None:
        super().__init__(host, timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class UnixSocketHandler(urllib.request.HTTPHandler):
    """Sends every ``http://`` request of an opener to one unix socket."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(UnixSocketConnection, self._path), req)


def opener_for(url: str) -> tuple[str, urllib.request.OpenerDirector]:
    """(base URL, opener) for an ``agent_url``: a unix socket's requests go to
    ``http://localhost`` through the socket."""
    if not url.startswith(UNIX_SCHEME):
        return url, urllib.request.build_opener()
    # No proxy: an http_proxy variable must not send a local socket's requests away.
    handler = UnixSocketHandler(url[len(UNIX_SCHEME) :])
    return "http://localhost", urllib.request.build_opener(urllib.request.ProxyHandler({}), handler)
