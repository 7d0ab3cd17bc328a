"""A route the router knows but the child's binary does not: say so, naming the binary.

b11434's router passes the child's answer through, and an older child (the pinned b10434 has
no ``/v1/systemone``) answers llama.cpp's bare 404 "File Not Found", which reads as if the
router had no such route. Corral keeps the 404 and says which binary lacks it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from node_agent.api.request_record import route_pattern
from node_agent.errors import ApiError

# llama.cpp's answer to a path it has no route for (server-http.cpp), byte for byte.
NOT_FOUND: dict[str, Any] = {
    "error": {"message": "File Not Found", "type": "not_found_error", "code": 404}
}
_NOT_FOUND_BYTES = json.dumps(NOT_FOUND, separators=(",", ":")).encode()


def route_of(request: web.Request) -> str:
    """The route's pattern (``/slots/{id_slot}``), else the path."""
    return route_pattern(request) or request.path


def endpoint_missing(
    response: web.StreamResponse, method: str, route: str, build_info: str, binary: str
) -> ApiError | None:
    """The error for a child that answered a route the router knows with "no such path",
    or None."""
    if (
        response.status != 404
        or not isinstance(response, web.Response)
        or response.body != _NOT_FOUND_BYTES
    ):
        return None
    return ApiError(
        404,
        f"{method} {route} is not served by llama-server {build_info} ({binary}): the "
        "endpoint is newer than that binary (llama.cpp b11434 has it); start the agent "
        "with a newer --llama-server",
    )
