"""``GET/POST /tools`` and ``/cors-proxy``, answered by the agent itself as llama.cpp's router
answers them (``server-tools.cpp``, ``server-cors-proxy.h``, ``server.cpp``).

Both run programs or reach other hosts on a client's behalf, so both are off unless the agent's
own command line turns them on (``--tools``/``--agent``, ``--mcp-servers-config``/
``--mcp-servers-json``, ``--ui-mcp-proxy``); off, they answer 403 "this feature is disabled".
The tools are llama.cpp's built-in ones (``node_agent.tools``), then the agent's MCP servers'
(``node_agent.mcp``): ``<server>_<tool>`` with an OpenAI function definition. A chat request
never runs a tool here: the client puts the definitions in ``tools``, runs the model's tool
calls through ``POST /tools`` and sends the results back as ``tool`` messages.
"""

from __future__ import annotations

import codecs
import json
import logging
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from yarl import URL

from node_agent.api.bodies import read_body, read_control_body
from node_agent.api.body_fields import loads
from node_agent.api.replies import json_reply
from node_agent.clip import clip
from node_agent.errors import ApiError
from node_agent.mcp.servers import McpServers
from node_agent.mcp.stdio import ToolDef

if TYPE_CHECKING:  # imported only when tools are on (node_agent.agent)
    from node_agent.tools.builtin import Tool
    from node_agent.tools.toolbox import Toolbox

log = logging.getLogger("corral.tools")

DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
# llama.cpp: an unknown tool (or ``stream`` for a tool that cannot stream) is a 404, whose
# body its HTTP layer replaces with the generic one.
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
PROXY_HEADER_PREFIX = "x-llama-server-proxy-header-"
PROXY_TIMEOUT_SECONDS = 600  # llama.cpp's read and write timeouts for the proxy
# Request headers llama.cpp turns into tool parameters (the runtime sets them, not the model).
PARAM_HEADERS = {"cwd": "x-tool-cwd", "runtime": "x-tool-runtime", "resp_type": "x-resp-type"}


class RuntimeNotAllowed(Exception):
    """An ``X-Tool-Runtime`` header that names a runtime other than the agent's own."""


MCP_SERVERS: web.AppKey[McpServers | None] = web.AppKey("corral_mcp", McpServers)
BUILTIN: web.AppKey[Toolbox | None] = web.AppKey("corral_builtin_tools")
PROXY_SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey(
    "corral_cors_proxy", aiohttp.ClientSession
)


def _compact(data: Any) -> str:
    """An event's JSON, compact (as llama.cpp writes its own)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def security_warning(
    servers: McpServers | None, cors_proxy: bool, builtin: Toolbox | None = None
) -> str:
    """llama.cpp's start-up warning, naming every feature that should not face the Internet."""
    features = ["router mode"]
    if cors_proxy:
        features.append("MCP proxy (experimental)")
    if builtin is not None and (builtin.tools or servers):  # llama.cpp: once tools are set up
        if builtin.tools:
            features.append("server tools (experimental)")
        if builtin.runtime:
            features.append("tools runtime (experimental)")
    if servers:
        features.append("MCP servers (experimental)")
    return f"security: {', '.join(features)} enabled - do not expose to untrusted environments"


def setup_tools(
    app: web.Application,
    servers: McpServers | None,
    cors_proxy: bool,
    builtin: Toolbox | None = None,
) -> None:
    app[MCP_SERVERS] = servers
    app[BUILTIN] = builtin
    if servers or (builtin is not None and builtin.tools):
        app.router.add_get("/tools", list_tools)
        app.router.add_post("/tools", call_tool)
    else:
        app.router.add_get("/tools", disabled)
        app.router.add_post("/tools", disabled)
    if cors_proxy:
        app.router.add_get("/cors-proxy", cors_proxy_request)
        app.router.add_post("/cors-proxy", cors_proxy_request)
        app.cleanup_ctx.append(_proxy_session)
    else:
        app.router.add_get("/cors-proxy", disabled)
        app.router.add_post("/cors-proxy", disabled)


async def disabled(request: web.Request) -> web.StreamResponse:
    return json_reply(DISABLED, 403)


def tool_name(tool: ToolDef) -> str:
    return f"{tool.server}_{tool.name}"


def tool_entry(tool: ToolDef) -> dict[str, Any]:
    """One ``GET /tools`` entry (llama.cpp's ``server_tool::to_json`` for an MCP tool)."""
    name = tool_name(tool)
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    return {
        "display_name": name,
        "tool": name,
        "type": "mcp",
        "permissions": {"write": False},
        "uses_cwd": False,
        "definition": {
            "type": "function",
            "function": {"name": name, "description": tool.description, "parameters": schema},
        },
    }


def _tools(request: web.Request) -> dict[str, ToolDef]:
    """MCP tools by name; a name that a built-in tool or an earlier server has is left out
    (llama.cpp skips those with a warning at start)."""
    servers = request.app[MCP_SERVERS]
    builtin = request.app[BUILTIN]
    taken = set(builtin.tools) if builtin is not None else set()
    found: dict[str, ToolDef] = {}
    for tool in servers.tools if servers else []:
        if tool_name(tool) not in taken:
            found.setdefault(tool_name(tool), tool)
    return found


async def list_tools(request: web.Request) -> web.StreamResponse:
    builtin = request.app[BUILTIN]
    entries = builtin.entries() if builtin is not None else []
    return json_reply(entries + [tool_entry(t) for t in _tools(request).values()])


def _invalid(message: str) -> web.Response:
    # llama.cpp answers these without the ``{"error": …}`` wrapper of its other 400s.
    body = {"code": 400, "message": message, "type": "invalid_request_error"}
    return json_reply(body, 400)


def _failed(message: str) -> web.Response:
    return json_reply({"code": 500, "message": message, "type": "server_error"}, 500)


async def call_tool(request: web.Request) -> web.StreamResponse:
    """llama.cpp's ``handle_post``, step by step: read the body (a 400 in nlohmann's words
    where it cannot), set the runtime's parameters from headers, find the tool (404), run it
    (a bad runtime is a 500); ``stream`` answers Server-Sent Events."""
    # Imported here: node_agent.tools is loaded only by an agent that has tools on.
    from node_agent.tools.params import ParamError, as_bool, as_str, at
    from node_agent.tools.toolbox import CANCELLED, ToolboxClosed

    error, body = loads(await read_control_body(request))
    if error is not None:
        return _invalid(error)
    try:
        # A lone surrogate (\ud800) is no text, 1e999 or NaN no number: llama.cpp's parser
        # refuses them, so do we.
        json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
    except UnicodeError as exc:
        return _invalid(f"the request body is not valid JSON: {exc}")
    except ValueError:
        return _invalid(
            "the request body is not valid JSON: a number overflows a double (like 1e999) "
            "or is NaN/Infinity"
        )
    try:
        name = as_str(at(body, "tool"))
        params = body.get("params", {})
        stream = as_bool(body["stream"]) if "stream" in body else False
        params = await _runtime_params(request, params)
    except ToolboxClosed:
        return json_reply(CANCELLED)
    except RuntimeNotAllowed as exc:
        body = {"code": 403, "message": str(exc), "type": "permission_error"}
        return json_reply(body, 403)
    except ParamError as exc:
        return _invalid(str(exc))
    except RuntimeError as exc:  # the --tools-runtime container could not be started again
        return _failed(str(exc))
    builtin = request.app[BUILTIN]
    tool = builtin.find(name) if builtin is not None else None
    if builtin is not None and tool is not None and (tool.streams or not stream):
        if stream:
            return await _stream_tool(request, builtin, tool, params)
        try:
            return json_reply(await builtin.invoke(tool, params, None))
        except ParamError as exc:
            return _invalid(str(exc))
        except Exception as exc:  # llama.cpp: any other failure of a tool is a 500
            log.warning("tool %s failed: %s", name, exc)
            return _failed(str(exc))
    mcp_tool = _tools(request).get(name)
    if mcp_tool is None or stream:  # no MCP tool streams its output
        return json_reply(NOT_FOUND, 404)
    servers = request.app[MCP_SERVERS]
    assert servers is not None  # it has a tool
    arguments = params if isinstance(params, dict) else {}
    result = await servers.call_tool(mcp_tool.server, mcp_tool.name, arguments)
    return json_reply(result)


async def _runtime_params(request: web.Request, params: Any) -> Any:
    """Tool parameters that only the runtime sets come from headers (and ``--tools-runtime``),
    never from the body."""
    from node_agent.tools.params import ParamError, type_name

    given = {p: request.headers.get(h, "") for p, h in PARAM_HEADERS.items()}
    builtin = request.app[BUILTIN]
    configured = builtin.runtime if builtin is not None else None
    own = (await builtin.runtime_spec() if builtin is not None else None) or ""
    if given["runtime"] and given["runtime"] not in (own, configured):
        # Unlike llama.cpp: a client that could name any container or ssh host would get
        # around the sandbox the agent's administrator chose.
        raise RuntimeNotAllowed(
            f"X-Tool-Runtime {clip(given['runtime'])!r} is not this agent's tools runtime "
            f"({configured or 'the host'}): a request may not choose where tools run; the "
            "agent's --tools-runtime sets it (send no X-Tool-Runtime header)"
        )
    given["runtime"] = own  # naming --tools-runtime itself (docker:IMAGE too) is its container
    values = {k: v for k, v in given.items() if v}
    if isinstance(params, dict):
        params = {k: v for k, v in params.items() if k not in PARAM_HEADERS}
    elif params is None and values:
        params = {}
    elif values:
        kind = type_name(params)
        raise ParamError(
            f"[json.exception.type_error.305] cannot use operator[] with a string argument "
            f"with {kind}"
        )
    return {**params, **values} if values else params


async def _stream_tool(
    request: web.Request, builtin: Toolbox, tool: Tool, params: Any
) -> web.StreamResponse:
    """Output as it comes, ``data: {"chunk": …}`` events, then ``data: {"done": true}`` (with
    ``"error"`` when the tool failed)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    async def push(chunk: bytes) -> bool:
        text = decoder.decode(chunk)
        if not text:
            return True
        try:
            await response.write(f"data: {_compact({'chunk': text})}\n\n".encode())
        except (ConnectionError, RuntimeError):
            return False  # the client went away: the program is stopped
        return True

    done: dict[str, Any] = {"done": True}
    try:
        failed = (await builtin.invoke(tool, params, push)).get("error")
        if failed:  # the shutdown ended it
            done["error"] = failed
    except Exception as exc:  # the tool's failure is the last event's business
        done["error"] = str(exc)
    try:
        await response.write(f"data: {_compact(done)}\n\n".encode())
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass
    return response


async def _proxy_session(app: web.Application) -> Any:
    timeout = aiohttp.ClientTimeout(
        total=None, sock_read=PROXY_TIMEOUT_SECONDS, sock_connect=PROXY_TIMEOUT_SECONDS
    )
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        app[PROXY_SESSION] = session
        yield


def _target(raw: str) -> URL:
    """The ``?url=`` to proxy to, split as llama.cpp splits it (``common_http_parse_url``),
    with its checks and messages (each a 500 there)."""
    scheme, sep, rest = raw.partition("://")
    if not sep:
        raise ApiError(500, "invalid URL: no scheme")
    if scheme not in ("http", "https"):
        raise ApiError(500, f"unsupported URL scheme: {scheme}")
    authority, _, path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        hostport = authority
    host, colon, port = hostport.rpartition(":") if not hostport.endswith("]") else ("", "", "")
    if not colon:
        host, port = hostport, ""
    host = host.removeprefix("[").removesuffix("]")
    if not host:
        raise ApiError(500, "invalid target URL: missing host")
    if userinfo.partition(":")[2]:
        raise ApiError(500, "authentication in target URL is not supported")
    if port and not port.isdigit():
        raise ApiError(400, f"invalid port in target URL: {port}")
    path, _, query = path.partition("?")
    try:
        return URL.build(
            scheme=scheme,
            host=host,
            port=int(port) if port else None,
            path="/" + path,
            query_string=query,
            encoded=True,
        )
    except ValueError as exc:
        raise ApiError(500, f"invalid target URL: {exc}") from exc


async def cors_proxy_request(request: web.Request) -> web.StreamResponse:
    """``--ui-mcp-proxy``: forward to ``?url=`` with only the ``X-Llama-Server-Proxy-Header-*``
    headers (prefix removed), so the web UI can reach an MCP server that sends no CORS."""
    url = _target(request.query.get("url", ""))
    headers = {
        key[len(PROXY_HEADER_PREFIX) :]: value
        for key, value in request.headers.items()
        if key.lower().startswith(PROXY_HEADER_PREFIX) and len(key) > len(PROXY_HEADER_PREFIX)
    }
    log.info("proxying %s request to %s", request.method, url.with_query(None))
    body = await read_body(request) if request.method == "POST" else None
    session = request.app[PROXY_SESSION]
    try:
        async with session.request(request.method, url, headers=headers, data=body) as upstream:
            response = web.StreamResponse(status=upstream.status)
            if "Content-Type" in upstream.headers:
                response.headers["Content-Type"] = upstream.headers["Content-Type"]
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
    except aiohttp.ClientError as exc:
        # llama.cpp's words and shape: a 500 whose body is only "proxy error: <why>".
        log.warning("cors-proxy: %s %s failed: %s", request.method, url.with_query(None), exc)
        return web.Response(status=500, text=f"proxy error: {exc}", content_type="application/json")
