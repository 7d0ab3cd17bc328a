"""``GET /models/logs?model=X``: a model's llama-server output, read through the API.

Children's stderr never goes into the agent's own log (it would drown it); each model keeps a
ring of its last lines, across restarts, so a crash's last words stay readable. ``lines=N``
limits the answer to the newest N lines; ``follow=1`` keeps the response open and streams new
lines as the child writes them (plain text, one line each), like ``tail -f``.
"""

from __future__ import annotations

from aiohttp import web

from node_agent.api.long_lived import until_shutdown
from node_agent.api.state import STATE, LogsFor
from node_agent.clip import clip
from node_agent.errors import ApiError

# The model's ring, made on first use (so ``follow`` works before the model's first load).
LOGS: web.AppKey[LogsFor] = web.AppKey("corral_logs")
DEFAULT_LINES = 200


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes", "on")


async def model_logs(request: web.Request) -> web.StreamResponse:
    registry = request.app[STATE].registry
    given = request.query.get("model")
    if not given:
        raise ApiError(400, "model name is missing from the request")
    name = registry.resolve(given)
    if name is None:
        raise ApiError(400, f"model '{clip(given)}' not found")
    try:
        lines = int(request.query.get("lines", DEFAULT_LINES))
    except ValueError:
        raise ApiError(400, "lines must be a whole number") from None
    if lines < 0:
        raise ApiError(400, "lines must be a whole number")
    ring = request.app[LOGS](name)
    backlog = ring.tail(lines) if lines else []
    if not _flag(request, "follow"):
        text = "".join(line + "\n" for line in backlog)
        return web.Response(text=text, content_type="text/plain")
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    await response.prepare(request)
    for line in backlog:
        await response.write(line.encode() + b"\n")
    async for line in until_shutdown(request.app, ring.follow(backlog=0)):
        await response.write(line.encode() + b"\n")
    await response.write_eof()
    return response


def setup_logs(app: web.Application, logs_for: LogsFor) -> None:
    app[LOGS] = logs_for
    app.router.add_get("/models/logs", model_logs)
