"""``GET /models/sse`` read in the background: every event a router sends, kept in order."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from tests.integration.harness import wait_until


class EventLog:
    """Reads a router's ``/models/sse`` on a thread from the moment it is made."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self._conn.request("GET", "/models/sse", headers=headers or {})
        self._response = self._conn.getresponse()
        assert self._response.status == 200, self._response.read()
        self._thread = threading.Thread(target=self._read, name="sse", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while line := self._response.fp.readline():
                if line.startswith(b"data:"):
                    with self._lock:
                        self.events.append(json.loads(line[5:]))
        except (OSError, ValueError):
            return

    def of(self, model: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["model"] == model]

    def names(self, model: str) -> list[str]:
        """The event names for ``model``, repeated progress reports folded into one."""
        names: list[str] = []
        for event in self.of(model):
            if not names or names[-1] != event["event"] or event["event"] != "download_progress":
                names.append(event["event"])
        return names

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        wait_until(check, f"{what}; events: {self.events}", timeout)

    def wait_event(self, model: str, event: str, timeout: float = 60) -> dict[str, Any]:
        self.wait(lambda: any(e["event"] == event for e in self.of(model)), event, timeout)
        return next(e for e in self.of(model) if e["event"] == event)

    def close(self) -> None:
        # Shut the socket first: the reader thread is blocked in readline() on it.
        if self._conn.sock is not None:
            with contextlib.suppress(OSError):
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._response.close()
        self._conn.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
