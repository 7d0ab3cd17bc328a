"""What a web browser may do with the agent: CORS as llama.cpp's router answers it, and two
guards llama.cpp does not have (docs/compatibility.md).

* **CORS** (``--cors-origins``, ``--cors-methods``, ``--cors-headers``, ``--cors-credentials``):
  the ``Access-Control-*`` headers of b11434's router (server-http.cpp, its pre-routing
  handler), on every answer, the proxied ones included (a child's own CORS headers are dropped,
  as the router drops them). Preflights are answered before the API key check: browsers send
  no key with them.
* **Host check** (``--allowed-hosts``): a page on ``evil.example`` whose name an attacker
  re-points at 127.0.0.1 (DNS rebinding) talks to a loopback-bound agent as "same origin",
  so CORS never applies; its requests still say ``Host: evil.example``. A loopback-bound agent
  therefore answers only to loopback names and IP literals by default.
* **Cross-site simple requests**: a ``text/plain`` or form POST from another origin needs no
  preflight, so ``--cors-origins`` cannot stop it (a page could unload a user's models).
  Such a POST is refused. Clients that are not browsers send no ``Origin``: ``curl -d`` (which
  labels JSON as a form) keeps working.
* **Cross-site GETs that load a model** (``/props?model=X&autoload=1``, even an ``<img>``'s):
  refused from an origin that ``--cors-origins`` does not allow, as such POSTs are.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from node_agent.clip import clip
from node_agent.errors import ApiError

log = logging.getLogger("corral.http")

# llama.cpp's defaults (common.h).
ANY_ORIGIN = "*"
LOCALHOST = "localhost"
DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_HEADERS = "*"
# llama.cpp's warning, word for word (server.cpp), for `*` without an API key.
OPEN_CORS_WARNING = (
    "security: no API key is set and CORS allows all origins "
    "(see https://github.com/ggml-org/llama.cpp/pull/25655)"
)
# ... and for the default that MCP servers switch to (arg.cpp).
TOOLS_CORS_WARNING = (
    "server tools or MCP servers are enabled, using localhost as default CORS origin "
    "(change via --cors-origins)"
)
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# The bodies a browser sends cross-origin without asking first (the Fetch standard's
# CORS-safelisted request header values of Content-Type).
_SIMPLE_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)
# Where multipart/form-data is the endpoint's own format (audio uploads; inference only).
_MULTIPART_PATHS = frozenset({"/v1/audio/transcriptions", "/audio/transcriptions"})
_PORT = re.compile(r"\s*[+-]?\d+")


@dataclass(frozen=True)
class BrowserPolicy:
    origins: str = ANY_ORIGIN
    methods: str = DEFAULT_METHODS
    headers: str = DEFAULT_HEADERS
    credentials: bool = True
    allowed_hosts: frozenset[str] | None = None
    """Host names (lower case, no port) answered besides loopback ones; None: no Host check."""


def cors_origins_default(given: str | None, *, tools_enabled: bool) -> str:
    """``--cors-origins`` in effect: as given, else ``localhost`` once router-run tools or MCP
    servers are on (llama.cpp's arg.cpp: they run programs), else ``*``."""
    if given is not None:
        return given
    return LOCALHOST if tools_enabled else ANY_ORIGIN


def is_loopback_bind(host: str) -> bool:
    """True for an agent that listens only on this machine (a unix socket needs no Host
    check: browsers cannot reach one)."""
    if host == LOCALHOST:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(given: str | None, bind_host: str) -> frozenset[str] | None:
    """The Host check for ``--allowed-hosts`` (comma-separated names, ``*``: no check).

    Default: on for a loopback-bound agent, off otherwise (an agent on a pod or LAN address
    is reached under names it cannot know: Services, ingresses, IPs)."""
    if given is None:
        return frozenset() if is_loopback_bind(bind_host) else None
    names = [name.strip().lower().rstrip(".") for name in given.split(",") if name.strip()]
    if ANY_ORIGIN in names:
        return None
    return frozenset(names)


def _url_host(url: str) -> str | None:
    """The host of an ``http(s)://`` URL the way llama.cpp's common_http_parse_url reads it
    (user info dropped, brackets off an IPv6 literal, a port that must be a number), or None
    where it throws."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        return None
    rest = rest.partition("@")[2] if "@" in rest else rest
    authority = rest.partition("/")[0]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return None
        host, after = authority[1:close], authority[close + 1 :]
        port = after[1:] if after.startswith(":") else ""
    else:
        host, _, port = authority.partition(":")
    if port:
        digits = _PORT.match(port)
        # std::stoi throws past an int. Counted before int(): Python refuses to read more
        # than 4,300 digits (a ValueError from a client's Origin, issue 26).
        number = digits.group().strip().lstrip("+-").lstrip("0") if digits else ""
        if digits is None or len(number) > 10 or int(number or "0") > 2**31 - 1:
            return None
    return host


def origin_is_localhost(origin: str) -> bool:
    return _url_host(origin) in _LOOPBACK_NAMES


def allow_origin(policy: BrowserPolicy, origin: str) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for a request's ``Origin`` (``""`` when it
    sent none), or None for no header."""
    if policy.origins == ANY_ORIGIN and policy.credentials:
        return origin  # llama.cpp echoes it, even an empty one
    if policy.origins == LOCALHOST:
        if origin and origin_is_localhost(origin):
            return origin
        if origin:
            log.warning("(CORS) skip non-localhost origin: %s", clip(origin))
        return None
    if "," in policy.origins:
        # llama.cpp sends the list as it is, which no browser accepts (the header holds one
        # origin): reflect the one that is listed (a deliberate difference, docs/compatibility.md).
        listed = {o.strip() for o in policy.origins.split(",")}
        return origin if origin in listed else None
    return policy.origins


def _host_name(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_allowed(allowed: frozenset[str] | None, host: str | None) -> bool:
    if allowed is None or not host:
        return True  # no check, or an HTTP/1.0 client (browsers always send Host)
    if len(host) > _HOST_CACHED:
        return _host_allowed.__wrapped__(allowed, host)
    return _host_allowed(allowed, host)


# Every request asks, nearly always with the same Host: the answers for short ones (a DNS name
# has at most 253 characters) are kept, so an IP literal is not parsed again each time.
_HOST_CACHED = 300


@functools.lru_cache(maxsize=256)
def _host_allowed(allowed: frozenset[str], host: str) -> bool:
    name = _host_name(host).rstrip(".")
    if name in allowed or name == LOCALHOST or name.endswith(".localhost"):
        return True  # *.localhost always resolves to loopback (RFC 6761): no rebinding
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True  # an IP literal cannot be rebound


def _same_origin(origin: str, host: str, scheme: str) -> bool:
    default = {"http": ":80", "https": ":443"}

    def plain(authority: str, scheme: str) -> str:
        return authority.lower().removesuffix(default.get(scheme, "\0"))

    origin_scheme, sep, authority = origin.partition("://")
    return bool(sep) and origin_scheme == scheme and plain(authority, scheme) == plain(host, scheme)


def cross_site_simple(
    method: str, path: str, headers: Mapping[str, str], scheme: str
) -> str | None:
    """Why a POST is refused as a browser's cross-origin "simple" request, or None."""
    if method != "POST":
        return None  # every other state-changing method needs a preflight, so CORS decides
    origin = headers.get("Origin")
    fetch_site = headers.get("Sec-Fetch-Site", "")
    if fetch_site in ("same-origin", "none"):
        return None
    if fetch_site not in ("cross-site", "same-site") and (
        origin is None or _same_origin(origin, headers.get("Host", ""), scheme)
    ):
        return None  # not a browser (curl sends no Origin), or the agent's own page
    kind = headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if kind and kind not in _SIMPLE_TYPES:
        return None  # e.g. application/json: the browser asked first, CORS allowed it
    if kind == "multipart/form-data" and path in _MULTIPART_PATHS:
        return None
    shown = f"Content-Type {kind!r}" if kind else "no Content-Type"
    return (
        f"a cross-origin POST with {shown} is refused: browsers send it without asking the "
        "server first, so any web page could make it; send the body as application/json"
    )


def origin_allowed(policy: BrowserPolicy, origin: str) -> bool:
    """Whether ``--cors-origins`` lets ``origin``'s pages read the agent's answers."""
    if policy.origins == ANY_ORIGIN:
        return True
    if policy.origins == LOCALHOST:
        return origin_is_localhost(origin)
    return origin in {o.strip() for o in policy.origins.split(",")}


def cross_site_load(policy: BrowserPolicy, headers: Mapping[str, str], scheme: str) -> str | None:
    """Why a GET that may load a model (``?model=``) is refused as another site's, or None.
    Browsers send a GET cross-site without asking first (a link, an ``<img>``), so CORS only
    hides the answer: the load, and the evictions it makes, happen all the same."""
    origin = headers.get("Origin")
    fetch_site = headers.get("Sec-Fetch-Site", "")
    if policy.origins == ANY_ORIGIN or fetch_site in ("same-origin", "none"):
        return None  # every site may, as --cors-origins says; or the user's own navigation
    if origin is not None:
        if _same_origin(origin, headers.get("Host", ""), scheme) or origin_allowed(policy, origin):
            return None
        why = f"from Origin {clip(origin)!r}, which --cors-origins does not allow"
    elif fetch_site == "cross-site":
        why = "from another site (Sec-Fetch-Site: cross-site)"
    else:
        return None  # not a browser (curl sends neither), or a page of the same site
    return (
        f"a GET that may load a model is refused for a request {why}: any web page could "
        "make it without asking first; send it from an allowed origin"
    )


def cross_site_proxy(policy: BrowserPolicy, headers: Mapping[str, str], scheme: str) -> str | None:
    """Why a ``/cors-proxy`` request is refused as another site's, or None. CORS only hides
    the answer: a page elsewhere could still make the agent fetch URLs (a blind SSRF)."""
    origin = headers.get("Origin")
    if headers.get("Sec-Fetch-Site") == "cross-site":
        why = "from another site (Sec-Fetch-Site: cross-site)"
    elif origin is None or _same_origin(origin, headers.get("Host", ""), scheme):
        return None  # not a browser, or the agent's own web UI
    elif allow_origin(policy, origin) in (origin, ANY_ORIGIN):
        return None
    else:
        why = f"from Origin {clip(origin)!r}, which --cors-origins does not allow"
    return (
        f"/cors-proxy is refused for a request {why}: any web page could make the agent "
        "fetch URLs for it; use the agent's own web UI, or list its origin in --cors-origins"
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard_middleware(
    policy: BrowserPolicy, loading_gets: frozenset[str] = frozenset()
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Host check, preflights, then cross-site simple requests: all before the API key.
    ``loading_gets``: the GET paths that load the model their ``?model=`` names."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not host_allowed(policy.allowed_hosts, request.headers.get("Host")):
            host = clip(request.headers.get("Host", ""))
            raise ApiError(
                403,
                f"Host {host!r} is not allowed: the agent answers only to local names and "
                "those of --allowed-hosts (a guard against DNS rebinding); add it with "
                f"--allowed-hosts {_host_name(host)}, or turn the check off with "
                "--allowed-hosts '*'",
            )
        if request.method == "OPTIONS":
            # Blank, as llama.cpp's (its headers are added in cors_headers below).
            return web.Response(status=200, content_type="text/html")
        refusal = cross_site_simple(request.method, request.path, request.headers, request.scheme)
        if refusal is None and request.path == "/cors-proxy":
            refusal = cross_site_proxy(policy, request.headers, request.scheme)
        loads = request.path in loading_gets and "model" in request.query
        if refusal is None and request.method in ("GET", "HEAD") and loads:
            refusal = cross_site_load(policy, request.headers, request.scheme)
        if refusal is not None:
            raise ApiError(403, refusal)
        return await handler(request)

    return guard


def cors_headers(
    policy: BrowserPolicy,
) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An ``on_response_prepare`` hook: the router's CORS headers replace the child's."""

    async def set_headers(request: web.Request, response: web.StreamResponse) -> None:
        for name in [k for k in response.headers if k.lower().startswith("access-control-")]:
            del response.headers[name]
        allowed = allow_origin(policy, request.headers.get("Origin", ""))
        if allowed is not None:
            response.headers["Access-Control-Allow-Origin"] = allowed
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Credentials"] = (
                "true" if policy.credentials else "false"
            )
            response.headers["Access-Control-Allow-Methods"] = policy.methods
            response.headers["Access-Control-Allow-Headers"] = policy.headers

    return set_headers


def start_warnings(
    policy: BrowserPolicy, api_keys: tuple[str, ...], *, tools_default: bool = False
) -> list[str]:
    """llama.cpp's warnings about browsers at start; ``tools_default``: MCP servers made
    ``localhost`` the default of ``--cors-origins``."""
    warnings = [TOOLS_CORS_WARNING] if tools_default else []
    if policy.origins == ANY_ORIGIN and not api_keys:
        warnings.append(OPEN_CORS_WARNING)
    return warnings
