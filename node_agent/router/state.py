"""What every part of the HTTP app shares: the agent's state on the app, the routes that
proxy to a child. A leaf: the app, its metrics, its status page and its log routes all read
it, and it imports none of them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from node_agent.child.logs import LogRing
from node_agent.mcp.servers import McpServers
from node_agent.router.proxy import Proxy
from node_agent.router.registry import Registry

# Endpoints whose POST body names the model (llama.cpp's proxy_post routes).
PROXIED_POST = (
    "/completion",
    "/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/infill",
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
    "/tokenize",
    "/detokenize",
    "/apply-template",
)
# GET endpoints that name the model in ``?model=`` (they do not make a model younger).
PROXIED_GET = ("/props", "/metrics", "/slots")


@dataclass(frozen=True)
class RouterSettings:
    """What the HTTP layer needs of the agent's options."""

    models_max: int
    models_autoload: bool
    api_keys: tuple[str, ...]
    build_info: str
    max_body_bytes: int = 64 * 1024 * 1024
    cors_proxy: bool = False  # --ui-mcp-proxy


Reloader = Callable[[], Awaitable[None]]
LogsFor = Callable[[str], LogRing]


@dataclass(frozen=True)
class AgentState:
    registry: Registry
    proxy: Proxy
    settings: RouterSettings
    reload: Reloader
    binary: str
    logs_for: LogsFor | None = None  # the model's log ring, for GET /models/logs
    mcp_servers: McpServers | None = None  # the agent's own, for /tools


STATE: web.AppKey[AgentState] = web.AppKey("corral_state", AgentState)
