"""One error hierarchy for the agent.

Library errors are wrapped with ``raise ... from``; handlers turn ``ApiError`` into the
OpenAI-shaped body that llama.cpp's router sends (``{"error": {"code", "message", "type"}}``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from node_agent.redact import redact_clipped

# The most of an error message a client gets: client text in it is clipped where it is put in
# (node_agent.clip); this bounds what was not (issue 26).
MESSAGE_CHARS = 4000


class CorralError(Exception):
    """Base of every error Corral raises on purpose."""


class ConfigError(CorralError):
    """A flag, preset file or models directory that cannot be used as given.

    The message says what was wrong, where (file and line when there is one) and how to fix it.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
        self.message = message  # without the file:line prefix
        self.path = path
        self.line = line


class BinaryError(CorralError):
    """No usable llama-server binary was found, or it cannot run on this machine."""


class ChildError(CorralError):
    """A llama-server child failed to start, become ready or stop."""


class ApiError(CorralError):
    """An error answered to an HTTP client, in llama.cpp's error shape."""

    # llama.cpp's error types by status code (server-common: format_error_response).
    _TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        500: "server_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        # Corral's extra (e.g. why a load failed): under its own key, so llama.cpp's clients
        # see the code, message and type they expect.
        self.detail = detail

    @property
    def type(self) -> str:
        return self._TYPES.get(self.status, "server_error")

    def body(self) -> dict[str, Any]:
        """The client's error body, with every secret hidden (issue 16, row 10)."""
        message = redact_clipped(self.message, MESSAGE_CHARS)
        error: dict[str, Any] = {"code": self.status, "message": message, "type": self.type}
        if self.detail:
            error["corral"] = {
                k: redact_clipped(v, MESSAGE_CHARS) if isinstance(v, str) else v
                for k, v in self.detail.items()
            }
        return {"error": error}
