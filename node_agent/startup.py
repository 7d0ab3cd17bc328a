"""What ``corral agent`` checks as it starts: where it listens, and sources that give nothing.

A port already taken, a host that is not this machine's or a socket path in a missing folder
is one line that says where and what to do (not the event loop's traceback). A ``--host``
ending in ``.sock`` is a unix socket path, as llama-server's ``server_http_context::start``
has it (the port is then ignored). A ``--models-dir`` without a model and a preset whose
``model =`` file is missing are warnings: the agent still starts (the file may come later,
``GET /models?reload=1`` picks it up), but a newcomer sees why the list is empty. With
``--ssl-cert-file`` and ``--ssl-key-file`` it serves HTTPS, as llama-server does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from node_agent.api.browser_guard import (
    DEFAULT_HEADERS,
    DEFAULT_METHODS,
    BrowserPolicy,
    allowed_hosts,
    cors_origins_default,
)
from node_agent.config import DEFAULTS, UNIX_SOCKET_SUFFIX, AgentOptions
from node_agent.errors import ConfigError
from node_agent.sources.catalog import Catalog
from node_agent.sources.hf_cache import hub_dir
from node_agent.sources.models_dir import GGUF, scan_models_dir
from node_agent.sources.preset_dir import preset_files, preset_policy
from node_agent.sources.preset_ini import load_preset_file
from node_agent.sources.spec import SOURCE_MODELS_DIR
from node_agent.tls_client import ca_context

log = logging.getLogger("corral.agent")

DEFAULT_PORT = DEFAULTS["port"]
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket


@dataclass(frozen=True, slots=True)
class Listening:
    url: str
    """``http://host:port``, or ``unix:///path.sock`` (llama-server's own spelling)."""
    port: int | None
    """The TCP port bound (``--port 0`` picks one); None on a unix socket."""


def tls_context(options: AgentOptions) -> ssl.SSLContext | None:
    """The server's TLS context from ``--ssl-cert-file``/``--ssl-key-file``, None without
    them; ConfigError naming the file when it cannot be used."""
    if options.ssl_cert_file is None or options.ssl_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(options.ssl_cert_file, options.ssl_key_file)
    except FileNotFoundError as exc:
        raise ConfigError(f"TLS: {exc.filename} does not exist") from exc
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"TLS: cannot use --ssl-cert-file {options.ssl_cert_file} with --ssl-key-file "
            f"{options.ssl_key_file} ({exc}): both must be PEM files, the key unencrypted and "
            "matching the certificate"
        ) from exc
    return context


def peer_tls_context(options: AgentOptions) -> ssl.SSLContext:
    """How HTTPS peers' certificates are checked: against ``--peer-ca-file``'s CA
    certificates, or the system's trusted ones; ConfigError when the file cannot be used."""
    if options.peer_ca_file is None:
        return ssl.create_default_context()
    return ca_context(options.peer_ca_file, "--peer-ca-file")


async def listen(
    runner: web.AppRunner, host: str, port: int, tls: ssl.SSLContext | None = None
) -> Listening:
    """Start serving ``runner`` on ``host:port`` or the unix socket ``host`` (over TLS with
    ``tls``); ConfigError (one line: where, why, what to do) when it cannot."""
    if host.endswith(UNIX_SOCKET_SUFFIX):
        if port != DEFAULT_PORT:  # llama-server ignores it silently; say so
            log.warning("--port %s is not used: --host %s is a unix socket", port, host)
        refuse_live_socket(host)
        site: web.BaseSite = web.UnixSite(runner, host, ssl_context=tls)
        where = f"unix socket {host}"
    else:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        where = f"{host}:{port}"
    try:
        await site.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {where}: {bind_failure(exc, host, port)}") from exc
    if isinstance(site, web.UnixSite):
        return Listening(f"unix://{host}", None)
    bound = next((a[1] for a in runner.addresses if isinstance(a, tuple)), port)
    shown = f"[{host}]" if ":" in host else host
    return Listening(f"{'https' if tls else 'http'}://{shown}:{bound}", bound)


def refuse_live_socket(path: str) -> None:
    """asyncio removes a socket file in the way before it binds, even one a running server
    listens on: a second agent on the same path would silently take it over. A stale file
    (its server is gone) is removed as asyncio would."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return  # bind fails with "address in use"; bind_failure says what is there
    except OSError:
        return  # nothing there yet
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return  # stale
    raise ConfigError(
        f"cannot listen on unix socket {path}: a server is listening on it already; "
        "stop it or give another --host path"
    )


def bind_failure(exc: OSError, host: str, port: int) -> str:
    """Why binding failed, and what to do about it, in a few words."""
    if isinstance(exc, socket.gaierror):
        return f"{host!r} is not an address or host name of this machine (check --host)"
    if host.endswith(UNIX_SOCKET_SUFFIX):
        if exc.errno == errno.EADDRINUSE:
            return "something other than a socket is at that path; remove it or choose another"
        return f"{exc.strerror or exc} (check the --host path and its folder)"
    if exc.errno == errno.EADDRINUSE:
        holder = port_holder(port)
        by = f" by {holder}" if holder else ""
        return f"the port is in use{by}; choose another --port, or stop what holds it"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges); choose another --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "that address is not one of this machine's (check --host)"
    return f"{exc.strerror or exc}"


def port_holder(port: int, proc: Path = Path("/proc")) -> str | None:
    """``pid N (command)`` of a process listening on TCP ``port``, if Linux's /proc tells
    (only processes we may inspect: usually our own user's)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == TCP_LISTEN and int(local.rpartition(":")[2], 16) == port:
                    inodes.add(f"socket:[{inode}]")
    if not inodes:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    command = b" ".join(a for a in argv[:3] if a).decode(errors="replace")
                    return f"pid {entry.name} ({command})"
    return None


def browser_policy(options: AgentOptions, *, tools_enabled: bool = False) -> BrowserPolicy:
    """What browsers may do (api/browser_guard.py), from the agent's flags.

    ``tools_enabled``: router-run tools or MCP servers are on, which makes ``localhost`` the
    default of ``--cors-origins`` (llama.cpp's rule: those run programs)."""
    return BrowserPolicy(
        origins=cors_origins_default(options.cors_origins, tools_enabled=tools_enabled),
        methods=options.cors_methods if options.cors_methods is not None else DEFAULT_METHODS,
        headers=options.cors_headers if options.cors_headers is not None else DEFAULT_HEADERS,
        credentials=options.cors_credentials is not False,
        allowed_hosts=allowed_hosts(options.allowed_hosts, options.host),
    )


def source_warnings(options: AgentOptions, env: Mapping[str, str], catalog: Catalog) -> list[str]:
    """Sources that were given but give no model, in words a newcomer can act on."""
    warnings: list[str] = []
    models_dir = options.models_dir
    # A model listed from the folder proves it holds one (a rescan of 1000 models delayed the
    # first answer); only a folder that shows none is looked at again.
    from_dir = any(spec.source == SOURCE_MODELS_DIR for spec in catalog.models.values())
    if models_dir is not None and not from_dir and not scan_models_dir(models_dir).specs:
        warnings.append(
            f"--models-dir {models_dir} holds no model: no {GGUF} file at its top level and "
            f"no folder (one level down) with one"
        )
    # Read as the catalog read them (an operator's file with its JSON-string values).
    policy = preset_policy(options.models_preset, [options.models_dir])
    for path in preset_files(options.models_preset, env.get("NODE_NAME")):
        with contextlib.suppress(ConfigError):  # the catalog read it (or refused it) just now
            for name, layer in load_preset_file(path, policy).sections.items():
                model = dict(layer.options).get("model")
                if isinstance(model, str) and not os.path.exists(model):
                    relative = "" if os.path.isabs(model) else f" (relative to {os.getcwd()})"
                    warnings.append(
                        f"{layer.origin}: preset [{name}]: its model file {model}{relative} "
                        "does not exist; loading it will fail until it does"
                    )
    if not catalog and not options.models_dir and not options.models_preset:
        hub = hub_dir(env)
        warnings.append(
            f"no models: give --models-dir DIR or --models-preset FILE (the Hugging Face cache "
            f"{hub if hub is not None else '(none)'} holds no GGUF model)"
        )
    return warnings
