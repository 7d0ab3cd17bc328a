"""What every part of the HTTP app shares: the agent's state on the app, the routes that
proxy to a child. A leaf: the app, its metrics, its status page and its log routes all read
it, and it imports none of them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from node_agent.api.browser_guard import BrowserPolicy
from node_agent.api.connections import DEFAULT_CLIENT_TIMEOUT
from node_agent.api.peers import Peers
from node_agent.api.proxy import Proxy
from node_agent.api.vertex import Vertex
from node_agent.child.logs import LogRing
from node_agent.mcp.servers import McpServers
from node_agent.runtime.registry import Registry

if TYPE_CHECKING:  # pydantic is imported lazily (start-up time)
    from node_agent.models_schema import RefusedPreset
    from node_agent.tools.toolbox import Toolbox

# Endpoints whose POST body names the model (llama.cpp's proxy_post routes; b11434's table in
# server.cpp). A multipart body (audio uploads) names it in its ``model`` field.
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
    # added since b10434 (the pinned binary's children lack /v1/systemone: missing_endpoint.py)
    "/v1/chat/completions/control",
    "/responses",
    "/v1/audio/transcriptions",
    "/audio/transcriptions",
    "/v1/systemone",
    "/chat/completions/input_tokens",
    "/v1/chat/completions/input_tokens",
    "/responses/input_tokens",
    "/v1/responses/input_tokens",
    "/lora-adapters",
    "/slots/{id_slot}",
    "/props",  # POST: the model is in the body, as for every POST (not in ?model=)
)
# GET endpoints that name the model in ``?model=`` (they do not make a model younger).
PROXIED_GET = ("/props", "/metrics", "/slots", "/lora-adapters")


@dataclass(frozen=True)
class RouterSettings:
    """What the HTTP layer needs of the agent's options."""

    models_max: int
    models_autoload: bool
    api_keys: tuple[str, ...]
    build_info: str
    max_body_bytes: int = 64 * 1024 * 1024
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT
    browser: BrowserPolicy = field(default_factory=BrowserPolicy)
    vertex: Vertex | None = None  # Google Cloud's prediction routes (AIP_MODE=PREDICTION)
    cors_proxy: bool = False  # --ui-mcp-proxy
    unready: str | None = None  # why /health answers 503 (GPUs expected and not seen)
    metrics_keys: tuple[str, ...] = ()  # they open GET /metrics only


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
    builtin_tools: Toolbox | None = None  # llama.cpp's built-in tools, for /tools
    peers: Peers | None = None  # with --peer: where else a request may be served
    refused: Callable[[], list[RefusedPreset]] | None = None  # presets refused alone


STATE: web.AppKey[AgentState] = web.AppKey("corral_state", AgentState)
