"""Free loopback ports for children.

The agent picks the port rather than passing ``--port 0``: llama-server binds before it loads
(``/health`` answers 503 meanwhile) but logs the port it got (``listening on http://…``) only
*after* the model has loaded, so with ``--port 0`` nobody could poll a loading child, and a
binary without the parent–child protocol would have to be parsed for it. Picking first leaves a
short race (someone else binds the port before the child does); the child then exits at once
with ``couldn't bind HTTP server socket`` and the supervisor retries on another port.

Ports handed out and not yet released are remembered, so two children spawned by this agent in
the same instant never get the same one.
"""

from __future__ import annotations

import socket

CHILD_HOST = "127.0.0.1"  # where every child listens (the one place it is named)

_reserved: set[int] = set()


def reserve_port(host: str = CHILD_HOST) -> int:
    """A port that was free on ``host`` a moment ago and is not held by another child of ours."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in _reserved:
            _reserved.add(port)
            return port
    raise OSError("no free loopback port found in 64 tries")


def release_port(port: int | None) -> None:
    if port is not None:
        _reserved.discard(port)
