"""``corral agent``'s command line: llama-server's router flags, Corral's own, and the rest.

Drop-in rule (SPEC "Node agent"): whatever ``llama-server --models-dir D …`` accepts,
``corral agent --models-dir D …`` accepts with the same meaning. The router flags keep
llama-server's names, defaults and ``LLAMA_ARG_*`` env names (the command line wins over the
env). Every other llama-server option is collected for the children, where it overrides
per-model preset values (llama.cpp merges the router's own arguments over every preset).
As in llama.cpp, ``--timeout`` and ``--sleep-idle-seconds`` also reach every child: a child
is what sleeps, and the proxy hop should time out like the child does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from node_agent.core import stream_pace
from node_agent.durations import idle_seconds
from node_agent.errors import ConfigError
from node_agent.event_loop import check_event_loop
from node_agent.sources.options import Match, generated_options, llama_options, parse_bool
from node_agent.sources.spec import OptionValue
from node_agent.tls_client import DNS_LABEL, server_name

T = TypeVar("T")

LOG_LEVELS = ("debug", "info", "warning", "error")
# Options that make llama-server serve one model instead of routing; an agent serves many.
SINGLE_MODEL = frozenset({"model", "hf-repo", "mmproj", "alias", "model-url", "docker-repo"})
# Options that only print something and exit.
INFORMATIONAL = frozenset({"usage", "version", "cache-list", "completion-bash"})
# Router flags that are also given to every child (see the module docstring).
ALSO_FOR_CHILDREN = frozenset({"timeout", "sleep-idle-seconds"})


UNIX_SOCKET_SUFFIX = ".sock"  # llama-server: a host ending so is an AF_UNIX path


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """Everything ``corral agent`` was told, validated."""

    host: str = "127.0.0.1"
    port: int = 8080
    models_dir: str | None = None
    models_preset: str | None = None
    """A file or a folder of files, as given."""
    models_max: int = 4
    """At most this many children at once; ≤ 0 means no limit (llama.cpp's 0 = unlimited)."""
    models_autoload: bool = True
    api_keys: tuple[str, ...] = ()
    """From ``--api-key`` (comma-separated) and ``--api-key-file`` (one a line)."""
    metrics_keys: tuple[str, ...] = ()
    """Keys that open ``GET /metrics`` only (a scraper's), from ``--metrics-key-file`` and
    ``$CORRAL_METRICS_KEY``: the inference key need not be handed to the monitoring stack."""
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    """PEM files: the agent serves HTTPS when both are given (llama-server's TLS flags)."""
    cors_origins: str | None = None
    cors_methods: str | None = None
    cors_headers: str | None = None
    cors_credentials: bool | None = None
    """llama-server's CORS flags; None = not given (llama.cpp's defaults, api/browser_guard)."""
    timeout: int = 3600
    sleep_idle_seconds: int = -1
    """-1 = children never sleep."""
    mcp_servers_config: str | None = None
    mcp_servers_json: str | None = None
    """MCP servers the agent runs for ``/tools`` (never passed to children)."""
    ui_mcp_proxy: bool = False
    """Serve ``/cors-proxy`` (llama.cpp's web UI reaches remote MCP servers through it)."""
    tools: tuple[str, ...] = ()
    tools_runtime: str | None = None
    """llama.cpp's built-in tools the agent runs for ``/tools`` (``--tools``, ``--agent``) and
    where (``--tools-runtime``); never from a preset, never passed to children."""
    # Corral's own.
    llama_server: str | None = None
    models_memory_margin: int | None = None
    """MiB to keep free on every device; None = the memory ledger does not limit loads."""
    memory_limits: tuple[tuple[str, int], ...] = ()
    """(device, bytes) caps on what the ledger may use, from ``--memory-limit DEV=SIZE``."""
    max_body_size: int = 64 * 1024 * 1024
    """Request bodies larger than this are refused with 413."""
    load_timeout: float = 600.0
    """A child not ready this long after its spawn is killed and its load fails; a preset's
    download (part of its load) fails past it too."""
    max_download_size: int | None = None
    """No file the agent downloads may be larger than this (None: only its declared size)."""
    download_redirect_hosts: tuple[str, ...] = ()
    """Hosts (``.suffix`` for a domain) a download may be redirected to, beyond its own host
    and Hugging Face's CDN."""
    models_ttl: float | None = None
    """Unload a model idle this many seconds; None = never (a preset's ``ttl`` wins)."""
    queue_timeout: float | None = None
    """Fail a request that waited this long for its model; None = wait as long as it takes."""
    max_queue: int | None = None
    """Refuse requests beyond this many waiting; None = no limit."""
    max_child_errors: int = 5
    """5xx answers in a row after which a child is restarted as wedged; 0: never."""
    expect_gpus: int = 0
    """NVIDIA GPUs the agent must see; fewer and ``/health`` answers 503 (a GPU node's pod
    that would serve on its CPU is not ready)."""
    warm_cache_size: int = 2 << 30
    """Bytes of saved prompt caches (warm swaps) the agent keeps; 0: off. 2 GiB by default:
    a laptop's disk takes it (measured: 425 cached tokens of the 50 MB demo-medium make a
    2.6 MB file; a cache's size grows with the model's layers and context)."""
    cpu_turns: float = 1.0
    """``--cpu-turns``: where the children compute on the CPU alone, models take turns, and
    one computing holds the others back at most this many seconds (core/scheduler.py);
    0: they compute at once, as in llama.cpp."""
    stream_gather: float = stream_pace.DEFAULT_WINDOW
    """``--stream-gather``: seconds in which a child's fast stream gathers its events into one
    read (core/stream_pace.py); 0: each read as it comes."""
    client_timeout: float = 30.0
    """A client must send its request head, its body, or take streamed data within this long,
    and an idle keep-alive connection closes after it (api/connections.py)."""
    max_connections: int | None = None
    """At most this many client connections open; None = from the descriptor limit."""
    shutdown_timeout: float = 30.0
    """On SIGTERM/SIGINT: the whole shutdown (drain, children's exit) takes at most this
    long; then the children left are killed. Below the chart's 60 s grace period."""
    log_level: str = "info"
    event_loop: str = "auto"
    """``--event-loop``: auto (uvloop when installed), uvloop or asyncio (event_loop.py)."""
    peers: tuple[str, ...] = ()
    """Other agents' base URLs (``--peer``, repeatable): requests may go to where a model runs."""
    peers_from_service: tuple[str | None, str] | None = None
    """``--peers-from-service [NAMESPACE/]NAME``: (namespace or None for the pod's own, Service):
    the peers are the ready agents behind that headless Service (api/peer_discovery.py)."""
    kube_api: str | None = None
    """``--kube-api URL``: the apiserver for ``--peers-from-service``; None = in-cluster."""
    peer_ca_file: str | None = None
    """``--peer-ca-file``: PEM certificates that sign the peers' own (HTTPS peers only);
    None = the system's trusted ones."""
    peer_server_name: str | None = None
    """``--peer-server-name``: the name the peers' certificates are checked against instead
    of the address each is reached at (pods share one certificate for their Service's name)."""
    routing_metrics_port: int | None = None
    """``--routing-metrics-port``: where a router outside the agent reads what it needs to
    choose a node (api/routing_metrics.py), without credentials; None = not served."""
    allowed_hosts: str | None = None
    """``--allowed-hosts``: Host names answered besides local ones; None = by the bind address."""
    child_options: tuple[tuple[str, OptionValue], ...] = ()
    """llama-server options for every child, by canonical name, in command-line order."""
    show_help: bool = False
    show_version: bool = False


def llama_server_arg(argv: Sequence[str]) -> str | None:
    """``--llama-server PATH`` from the agent's arguments, before they are parsed: the binary
    must be known first, since its options decide which other flags are valid."""
    for i, word in enumerate(argv):
        if word == "--llama-server" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--llama-server="):
            return word.partition("=")[2]
    return None


def parse_agent_args(argv: Sequence[str], env: Mapping[str, str]) -> AgentOptions:
    """Parse ``corral agent``'s arguments (without the program and subcommand names)."""
    values: dict[str, object] = {}
    api_keys: list[str] = []
    api_key_files: list[str] = []
    limits: dict[str, int] = {}
    peers: list[str] = []
    children: dict[str, OptionValue] = {}
    table = llama_options()

    _apply_env(env, values, api_keys, api_key_files)
    words = _Words(argv)
    while (word := words.next()) is not None:
        if not word.startswith("-") or word == "-":
            raise ConfigError(
                f"unexpected argument {word!r}: corral agent takes only options "
                "(models come from --models-dir, --models-preset or the HF cache)"
            )
        flag, inline = word, None
        if word.startswith("--") and "=" in word:
            flag, _, inline = word.partition("=")

        def value(what: str, flag: str = flag, inline: str | None = inline) -> str:
            return inline if inline is not None else words.value_for(flag, what)

        own = _OWN_FLAGS.get(flag)
        if own is not None:
            field, what, convert = own
            raw = value(what)
            if field == "memory_limit":
                device, size = _memory_limit(raw)
                if device in limits:
                    raise ConfigError(f"--memory-limit: device {device!r} is given twice")
                limits[device] = size
            elif field == "peers":
                peers.append(_peer_url(raw))
            else:
                values[field] = _convert(flag, raw, what, convert)
            continue

        match = table.flag(flag) or _router_flag(flag)
        if match is None:
            hint = table.suggest_flag(flag, extra=_OWN_FLAGS)
            tail = f"; did you mean {hint}?" if hint else ""
            raise ConfigError(
                f"unknown option {flag}: not a corral agent option, nor one of {table.origin}{tail}"
            )
        opt = match.option
        name = opt.name
        if opt.is_flag and inline is not None:
            raise ConfigError(f"{flag} is a flag and takes no value (got {word!r})")
        if name in INFORMATIONAL:
            values["show_version" if name == "version" else "show_help"] = True
            continue
        if name in SINGLE_MODEL:
            raise ConfigError(
                f"{flag} names one model, but corral agent serves many: put models in "
                "--models-dir, or name them in a --models-preset file"
            )
        if name == _AGENT_FLAG:  # llama.cpp: all the built-in tools and the MCP proxy, or neither
            values["tools"] = () if match.negated else _tool_names("all")
            values["ui_mcp_proxy"] = not match.negated
            continue
        if name in _ROUTER:
            field, what, convert = _ROUTER[name]
            if opt.is_flag:
                values[field] = not match.negated
            elif name == "api-key":
                api_keys[:] = _split_keys(value(what), flag)
            elif name == "api-key-file":
                api_key_files[:] = [value(what)]
            else:
                raw = value(what)
                values[field] = _convert(flag, raw, what, convert)
                if name in ALSO_FOR_CHILDREN:
                    children[name] = raw
            continue
        if opt.is_flag:
            children[name] = not match.negated
        elif opt.nargs > 1:
            raise ConfigError(
                f"{flag} takes {opt.nargs} values, which corral agent cannot pass to children "
                "(llama.cpp's presets cannot either)"
            )
        else:
            raw = value(opt.expects())
            expected = opt.check(raw)
            if expected is not None:
                raise ConfigError(f"{flag} expects {expected}, got {raw!r}")
            children[name] = raw

    # llama-server serves plain HTTP when only one of the two is set; a user who gave one
    # meant TLS, so half a pair is an error here.
    if ("ssl_key_file" in values) != ("ssl_cert_file" in values):
        given, missing = (
            ("--ssl-key-file", "--ssl-cert-file")
            if "ssl_key_file" in values
            else ("--ssl-cert-file", "--ssl-key-file")
        )
        raise ConfigError(f"{given} needs {missing} too: TLS takes a key and its certificate")
    if values.get("tools_runtime") and not (
        values.get("tools") or values.get("mcp_servers_config") or values.get("mcp_servers_json")
    ):
        # llama.cpp ignores it then (it sets tools up only when some are on)
        raise ConfigError(
            "--tools-runtime says where tools run, but no tool is on: give --tools (or --agent, "
            "or MCP servers) too"
        )
    if "kube_api" in values and "peers_from_service" not in values:
        raise ConfigError("--kube-api is only used by --peers-from-service: give both, or neither")
    _check_peer_tls(values, peers)
    _check_routing_port(values)
    keys = list(api_keys)
    for path in api_key_files:
        keys.extend(_read_key_file(path))
    metrics_keys = _metrics_keys(values.pop("metrics_key_file", None), env)
    if metrics_keys and not keys:
        raise ConfigError(
            "a metrics key (--metrics-key-file or $CORRAL_METRICS_KEY) guards /metrics only "
            "behind an API key, and there is none: /metrics is open to everyone; give "
            "--api-key or --api-key-file too, or leave the metrics key out"
        )
    return AgentOptions(
        **values,  # type: ignore[arg-type]
        api_keys=tuple(keys),
        metrics_keys=metrics_keys,
        memory_limits=tuple(limits.items()),
        peers=tuple(dict.fromkeys(peers)),
        child_options=tuple(children.items()),
    )


class _Words:
    """The command line, consumed left to right."""

    def __init__(self, argv: Sequence[str]) -> None:
        self._argv = list(argv)
        self._next = 0

    def next(self) -> str | None:
        if self._next >= len(self._argv):
            return None
        self._next += 1
        return self._argv[self._next - 1]

    def value_for(self, flag: str, what: str) -> str:
        word = self.next()
        if word is None:
            raise ConfigError(f"{flag} expects {what}, but nothing follows it")
        return word


# --- converters -------------------------------------------------------------------------


def _convert(flag: str, raw: str, what: str, convert: Callable[[str], object]) -> object:
    try:
        return convert(raw)
    except ValueError as e:
        detail = f" ({e})" if str(e) and "invalid literal" not in str(e) else ""
        raise ConfigError(f"{flag} expects {what}, got {raw!r}{detail}") from None


def _int_at_least(low: int) -> Callable[[str], int]:
    def convert(raw: str) -> int:
        n = int(raw.strip())
        if n < low:
            raise ValueError(f"must be >= {low}")
        return n

    return convert


def _port(raw: str) -> int:
    n = int(raw.strip())
    if not 0 <= n <= 65535:
        raise ValueError("must be 0-65535")
    return n


def _seconds(raw: str) -> float | None:
    s = float(raw.strip())
    if s != s or s < 0:  # NaN or negative
        raise ValueError("must be >= 0")
    return s or None  # 0 = off


def _ttl(raw: str) -> float | None:
    return idle_seconds(raw) or None  # 0 and negative: never


def _body_size(raw: str) -> int:
    size = parse_size(raw)
    if size < 1024:
        raise ValueError("must be at least 1KiB")
    return size


def _hosts(raw: str) -> tuple[str, ...]:
    hosts = tuple(h.strip().lower() for h in raw.split(",") if h.strip())
    if not hosts or any("/" in h or ":" in h or " " in h for h in hosts):
        raise ValueError("host names, e.g. cdn.example.com,.example.net")
    return hosts


# A longer wait than this between a stream's pieces is a stall to its reader, not a gathering.
LONGEST_GATHER = 1.0


def _duration(raw: str, like: str) -> float:
    """Seconds >= 0 from a duration (``like``: examples for the error); 0 is off."""
    try:
        seconds = idle_seconds(raw)
    except ValueError:
        raise ValueError(f"expects a duration like {like} (seconds); 0: off") from None
    if seconds is None:
        raise ValueError("must be >= 0")
    return seconds


def _gather(raw: str) -> float:
    seconds = _duration(raw, "10ms or 0.01")
    if seconds > LONGEST_GATHER:
        raise ValueError(f"must be at most {LONGEST_GATHER:g}s")
    if seconds and not stream_pace.SUPPORTED:
        raise ValueError("works on Linux only; here a stream is read as it comes (0)")
    return seconds


def _turn(raw: str) -> float:
    return _duration(raw, "1s, 500ms or 2")


def _positive_seconds(raw: str) -> float:
    seconds = float(raw)
    if not seconds > 0:
        raise ValueError("must be > 0")
    return seconds


def _count_or_unlimited(raw: str) -> int | None:
    n = int(raw.strip())
    if n < 0:
        raise ValueError("must be >= 0")
    return n or None  # 0 = no limit


def _log_level(raw: str) -> str:
    level = raw.strip().lower()
    if level not in LOG_LEVELS:
        raise ValueError("one of " + ", ".join(LOG_LEVELS))
    return level


# node_agent.tools is imported only by an agent that is given tools (start-up time).
def _tool_names(raw: str) -> tuple[str, ...]:
    from node_agent.tools.names import check_tool_names, split_tool_names

    return check_tool_names(split_tool_names(raw))


def _tools_runtime(raw: str) -> str:
    from node_agent.tools.names import check_tools_runtime

    return check_tools_runtime(raw)


def _bool(raw: str) -> bool:
    flag = parse_bool(raw)
    if flag is None:
        raise ValueError("true/false, on/off, 1/0")
    return flag


def _identity(raw: str) -> str:
    return raw


def _nonempty(raw: str) -> str:
    if not raw:
        raise ValueError("the path is empty")
    return raw


_UNITS = {
    "": None,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(raw: str) -> int:
    """``8GiB`` -> bytes. IEC units (Ki, Mi, Gi, Ti, optionally with B) are powers of 1024;
    SI units (K, M, G, T, optionally with B) powers of 1000, as in Kubernetes quantities. A
    unit is required: a bare number is too easy to misread as MiB or bytes."""
    m = _SIZE.fullmatch(raw)
    unit = m.group(2).lower() if m else ""
    factor = _UNITS.get(unit) if m else None
    if m is None or factor is None:
        raise ValueError("a size with a unit, like 8GiB, 512MiB or 20G")
    return int(float(m.group(1)) * factor)


def _size_or_off(raw: str) -> int:
    """A size (``2GiB``), or ``0``: off."""
    return 0 if raw.strip() == "0" else parse_size(raw)


def _memory_limit(raw: str) -> tuple[str, int]:
    device, sep, size = raw.partition("=")
    if not sep or not device.strip():
        raise ConfigError(
            f"--memory-limit expects DEVICE=SIZE (e.g. host=8GiB or cuda0=20GiB), got {raw!r}"
        )
    try:
        return device.strip(), parse_size(size)
    except ValueError as e:
        raise ConfigError(f"--memory-limit {raw!r}: expected {e}") from None


def _peer_url(raw: str) -> str:
    """``--peer``: another agent's base URL, ``http(s)://host:port`` (no path, no query)."""
    url = raw.rstrip("/")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(f"--peer expects another agent's URL, http(s)://HOST:PORT, got {raw!r}")
    if parts.path or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"--peer {raw!r}: give only http(s)://HOST:PORT (no path or query)")
    return url


def discovered_scheme(ssl_cert_file: object) -> str:
    """How peers found by ``--peers-from-service`` are asked: over HTTPS when this agent
    serves it (``--ssl-cert-file``: its DaemonSet's pods all run the same flags)."""
    return "https" if ssl_cert_file else "http"


def _check_peer_tls(values: dict[str, object], peers: Sequence[str]) -> None:
    """``--peer-ca-file`` and ``--peer-server-name`` check HTTPS peers: with none they would
    change nothing, and a flag given is never ignored."""
    tls_flags = [f for f in ("peer_ca_file", "peer_server_name") if f in values]
    if not tls_flags:
        return
    https_given = any(urlsplit(p).scheme == "https" for p in peers)
    discovered = discovered_scheme(values.get("ssl_cert_file"))
    https_found = "peers_from_service" in values and discovered == "https"
    if not (https_given or https_found):
        flag = "--" + tls_flags[0].replace("_", "-")
        raise ConfigError(
            f"{flag} checks peers asked over HTTPS, and there is none: give --peer "
            "https://HOST:PORT, or --peers-from-service with --ssl-cert-file and --ssl-key-file "
            f"(this agent's own TLS, which its peers serve too), or leave {flag} out"
        )


# Slots dataclass: its class attributes are slots, the defaults are only in its fields.
DEFAULTS = {f.name: f.default for f in fields(AgentOptions)}


def _check_routing_port(values: dict[str, object]) -> None:
    """``--routing-metrics-port`` listens on ``--host``'s address, beside ``--port``."""
    if "routing_metrics_port" not in values:
        return
    port = values["routing_metrics_port"]
    host = str(values.get("host", DEFAULTS["host"]))
    if host.endswith(UNIX_SOCKET_SUFFIX):
        raise ConfigError(
            f"--routing-metrics-port {port} listens on --host's address, and --host {host} is "
            "a unix socket: give a TCP --host (e.g. 0.0.0.0), or leave --routing-metrics-port out"
        )
    if port == values.get("port", DEFAULTS["port"]) and port != 0:
        raise ConfigError(
            f"--routing-metrics-port {port} is --port too: the routing metrics are served "
            "without credentials on a port of their own; give another port"
        )


def _service(raw: str) -> tuple[str | None, str]:
    """``--peers-from-service``: ``NAME`` or ``NAMESPACE/NAME`` (Kubernetes DNS labels)."""
    namespace, _, name = raw.strip().rpartition("/")
    if not DNS_LABEL.fullmatch(name) or (namespace and not DNS_LABEL.fullmatch(namespace)):
        raise ValueError("lower-case letters, digits and '-', e.g. corral/corral-agent-headless")
    return namespace or None, name


def _api_url(raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ValueError("e.g. http://127.0.0.1:8001, kubectl proxy's address")
    return raw.strip().rstrip("/")


def _split_keys(raw: str, where: str) -> list[str]:
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    if not keys:  # "--api-key ," would otherwise leave every endpoint open, silently
        raise ConfigError(
            f"{where} {raw!r} holds no key: give one or more keys, comma-separated, or leave "
            "it out to run without one"
        )
    return keys


def _read_key_file(path: str, flag: str = "--api-key-file") -> list[str]:
    # llama.cpp: one key a line; lines starting with '#' are comments.
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"{flag} {path!r} cannot be read: {e.strerror}") from e
    keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"{flag} {path!r} holds no key (one a line; '#' comments)")
    return keys


METRICS_KEY_ENV = "CORRAL_METRICS_KEY"


def _metrics_keys(path: object, env: Mapping[str, str]) -> tuple[str, ...]:
    keys = (
        _split_keys(env[METRICS_KEY_ENV], f"${METRICS_KEY_ENV}") if env.get(METRICS_KEY_ENV) else []
    )
    if isinstance(path, str):
        keys.extend(_read_key_file(path, "--metrics-key-file"))
    return tuple(keys)


# --- flag tables ------------------------------------------------------------------------

# Router flags by llama.cpp canonical name: field, what the value must be, converter.
_ROUTER: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "host": ("host", "an address", _identity),
    "port": ("port", "a port number", _port),
    "models-dir": ("models_dir", "a directory", _identity),
    "models-preset": ("models_preset", "a preset file or folder", _identity),
    "models-max": ("models_max", "an integer (<= 0: no limit)", int),
    "models-autoload": ("models_autoload", "a boolean", _bool),
    "api-key": ("api_keys", "a key (or several, comma-separated)", _identity),
    "api-key-file": ("api_key_file", "a file", _identity),
    "ssl-key-file": ("ssl_key_file", "a PEM private key file", _identity),
    "ssl-cert-file": ("ssl_cert_file", "a PEM certificate file", _identity),
    "cors-origins": ("cors_origins", "origins (comma-separated, * or localhost)", _identity),
    "cors-methods": ("cors_methods", "methods (comma-separated)", _identity),
    "cors-headers": ("cors_headers", "headers (comma-separated)", _identity),
    "cors-credentials": ("cors_credentials", "a boolean", _bool),
    "timeout": ("timeout", "a number of seconds", _int_at_least(0)),
    "sleep-idle-seconds": ("sleep_idle_seconds", "seconds (-1: never)", _int_at_least(-1)),
    "mcp-servers-config": ("mcp_servers_config", "a JSON file of MCP servers", _identity),
    "mcp-servers-json": ("mcp_servers_json", "JSON with MCP server definitions", _identity),
    "webui-mcp-proxy": ("ui_mcp_proxy", "a boolean", _bool),
    "tools": ("tools", "tool names (comma-separated) or all", _tool_names),
    "tools-runtime": (
        "tools_runtime",
        "docker:IMAGE, podman:IMAGE, docker-container:ID, podman-container:ID or ssh:TARGET",
        _tools_runtime,
    ),
}
_AGENT_FLAG = "agent"  # --agent / --no-agent: two router settings at once (see the parser)

# Corral's own flags (no llama-server option has these names).
_OWN_FLAGS: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "--llama-server": ("llama_server", "a path to llama-server", _identity),
    "--models-memory-margin": ("models_memory_margin", "MiB (an integer >= 0)", _int_at_least(0)),
    "--memory-limit": ("memory_limit", "DEVICE=SIZE", _identity),
    "--models-ttl": ("models_ttl", "seconds, or 10m, 1h (0 or -1: never)", _ttl),
    "--load-timeout": ("load_timeout", "seconds (> 0)", _positive_seconds),
    "--max-body-size": ("max_body_size", "a size like 64MiB", _body_size),
    "--max-download-size": ("max_download_size", "a size like 20GiB", parse_size),
    "--download-redirect-hosts": ("download_redirect_hosts", "host names, comma-separated", _hosts),
    "--queue-timeout": ("queue_timeout", "seconds (0: wait forever)", _seconds),
    "--max-queue": ("max_queue", "a count (0: no limit)", _count_or_unlimited),
    "--max-child-errors": ("max_child_errors", "a count (0: never)", _int_at_least(0)),
    "--warm-cache-size": ("warm_cache_size", "a size like 2GiB (0: off)", _size_or_off),
    "--expect-gpus": ("expect_gpus", "a count (0: none)", _int_at_least(0)),
    "--metrics-key-file": ("metrics_key_file", "a file", _identity),
    "--shutdown-timeout": ("shutdown_timeout", "seconds (> 0)", _positive_seconds),
    "--client-timeout": ("client_timeout", "seconds (> 0)", _positive_seconds),
    "--cpu-turns": ("cpu_turns", "a duration like 1s (0: off)", _turn),
    "--stream-gather": ("stream_gather", "a duration like 10ms (0: off, at most 1s)", _gather),
    "--max-connections": ("max_connections", "a count (>= 1)", _int_at_least(1)),
    "--log-level": ("log_level", "one of " + ", ".join(LOG_LEVELS), _log_level),
    "--event-loop": ("event_loop", "auto, uvloop or asyncio", check_event_loop),
    "--peer": ("peers", "a URL (http://HOST:PORT)", _peer_url),
    "--peers-from-service": ("peers_from_service", "a Service, [NAMESPACE/]NAME", _service),
    "--kube-api": ("kube_api", "the Kubernetes API's URL", _api_url),
    "--peer-ca-file": ("peer_ca_file", "a PEM file of CA certificates", _nonempty),
    "--peer-server-name": ("peer_server_name", "a DNS name", server_name),
    "--routing-metrics-port": ("routing_metrics_port", "a port number", _port),
    "--allowed-hosts": ("allowed_hosts", "host names (comma-separated; *: no check)", _identity),
}


def _router_flag(flag: str) -> Match | None:
    """A router flag that the binary in use does not list (an older llama-server): the router
    is Corral, so its own flags never depend on the children's binary."""
    match = generated_options().flag(flag)
    known = match is not None and match.option.name in _ROUTER.keys() | {_AGENT_FLAG}
    return match if known else None


def _apply_env(
    env: Mapping[str, str], values: dict[str, object], keys: list[str], key_files: list[str]
) -> None:
    table = generated_options()  # the router's env names are Corral's own (see _router_flag)
    for name, (field, what, convert) in _ROUTER.items():
        var = table.named(name).env
        if var is None or var not in env:
            continue
        raw = env[var]
        if name in ("api-key", "api-key-file", "tools", "tools-runtime") and not raw:
            continue  # an empty variable is an unset one (a template that filled in nothing)
        if name == "api-key":
            keys[:] = _split_keys(raw, f"${var}")
        elif name == "api-key-file":
            key_files[:] = [raw]
        else:
            values[field] = _convert(f"${var}", raw, what, convert)
    # Last, as llama.cpp reads its variables in the order of its options.
    agent = table.named(_AGENT_FLAG).env
    if agent is not None and env.get(agent):
        on = _convert(f"${agent}", env[agent], "a boolean", _bool)
        values["tools"] = _tool_names("all") if on else ()
        values["ui_mcp_proxy"] = bool(on)
