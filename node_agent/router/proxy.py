"""Forward one HTTP request to a child llama-server and pass its answer back.

Bodies with a known length are answered in one piece; everything else (server-sent events,
chunked bodies) is passed through chunk by chunk as the child writes it, never buffered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from node_agent.errors import ApiError

CHILD_HOST = "127.0.0.1"

# RFC 9110 §7.6.1 hop-by-hop fields, plus those aiohttp computes itself for the new message.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Content-Encoding",
    )
)


def _forward_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for key, value in headers.items():
        if key.lower() not in _HOP_BY_HOP:
            out.add(key, value)
    return out


class Proxy:
    """A pooled HTTP client to the children (keep-alive connections per child port)."""

    def __init__(self, *, timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
        # auto_decompress off: the child's bytes go to the client as they are.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(
        self, request: web.Request, port: int, body: bytes | None
    ) -> web.StreamResponse:
        """Send ``request`` (with ``body`` already read) to the child on ``port``."""
        assert self._session is not None, "proxy not started"
        url = f"http://{CHILD_HOST}:{port}{request.rel_url}"
        headers = _forward_headers(request.headers)
        try:
            upstream = await self._session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            raise ApiError(502, f"the model's server did not answer: {exc}") from exc
        async with upstream:
            out_headers = _forward_headers(upstream.headers)
            if upstream.content_length is not None and "chunked" not in upstream.headers.get(
                "Transfer-Encoding", ""
            ):
                payload = await upstream.read()
                return web.Response(status=upstream.status, headers=out_headers, body=payload)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
                # The child died mid-stream: end the stream with an error event the client
                # can read, instead of a silently truncated body.
                message = f"the model's server stopped mid-response: {exc}"
                if "text/event-stream" in upstream.headers.get("Content-Type", ""):
                    error = ApiError(500, message).body()
                    await response.write(f"data: {json.dumps(error)}\n\n".encode())
            await response.write_eof()
            return response
