"""``corral agent``: wire the options, the catalog, the registry and the HTTP server together.

Shutdown, in uvicorn's and aiohttp's order: the signal handler only sets a flag; then the
registry closes (every request still arriving gets 503 with Retry-After, nothing is spawned),
the listener stops, requests in flight drain (each model up to its stop timeout) while the
children stop, and aiohttp's cleanup context ends the registry and the proxy. The whole of it
takes at most ``--shutdown-timeout``; past that, or on a second SIGTERM/SIGINT, the children
left are killed and the agent exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from node_agent import startup
from node_agent.aio import TaskSet
from node_agent.api.app import build_app
from node_agent.api.browser_guard import start_warnings
from node_agent.api.connections import BoundedRunner, default_max_connections
from node_agent.api.peers import Peers
from node_agent.api.proxy import Proxy
from node_agent.api.state import AgentState, RouterSettings
from node_agent.api.tools_api import security_warning
from node_agent.api.vertex import vertex_from_env
from node_agent.binary_probe import BinaryProbe
from node_agent.child.logs import LogRing
from node_agent.child.orphans import end_orphans
from node_agent.child.process import ChildConfig, ChildProcess
from node_agent.child.state import ChildEvent
from node_agent.config import AgentOptions, parse_agent_args
from node_agent.errors import ApiError, ConfigError, CorralError
from node_agent.extras import install_hint
from node_agent.llama_server.binary import build_info
from node_agent.mcp.config import load_servers
from node_agent.mcp.servers import McpServers
from node_agent.model_files import log_model_file_problems
from node_agent.ollama.routes import setup_ollama
from node_agent.redact import RedactingFilter, add_secret, add_secrets
from node_agent.runtime.model_downloads import DownloadSettings
from node_agent.runtime.registry import Registry
from node_agent.runtime.warm_swaps import WarmSwaps, warm_folder
from node_agent.source_watch import SourceWatch, watched_paths
from node_agent.sources.catalog import Catalog, diff_catalogs, keep_refused, load_catalog
from node_agent.sources.download import Limits, cache_dir
from node_agent.sources.hf_cache import hub_dir
from node_agent.sources.preset_dir import directory_version, preset_files, preset_policy
from node_agent.sources.spec import ModelSpec

if TYPE_CHECKING:  # imported lazily (start-up time): pydantic, the memory ledger, peer discovery
    from node_agent.api.peer_discovery import PeerDiscovery
    from node_agent.models_schema import RefusedPreset
    from node_agent.runtime.memory_watch import MemoryWatch
    from node_agent.tools.toolbox import Toolbox

log = logging.getLogger("corral.agent")

LOG_LINES = 2000  # stderr lines kept per model
# Imported in the background once the agent listens: GET /models and the first request's
# metrics need them, start-up does not (pydantic and prometheus_client are ~40% of the
# import time; agent start with 1000 models, bench S6).
IMPORTED_LATER = ("node_agent.models_schema", "node_agent.api.metrics_families")
ESTIMATOR = "node_agent.memory.estimator"
PRESET_POLL_SECONDS = 1.0  # the kubelet syncs ConfigMap volumes every ~60 s: 1 s is plenty

HELP = """\
usage: corral agent [OPTIONS] [LLAMA-SERVER OPTIONS]

llama-server router options (same names, defaults and LLAMA_ARG_* variables):
  --host HOST                 address to listen on, or a unix socket path ending in .sock
                              (default 127.0.0.1)
  --port PORT                 port to listen on (default 8080)
  --models-dir DIR            a folder of GGUF models (a subfolder is one model)
  --models-preset PATH        an INI of model presets, or a folder mounted from the operator
  --models-max N              at most N models loaded at once (default 4; <= 0: no limit)
  --models-autoload / --no-models-autoload
                              load a model when a request names it (default: on)
  --api-key KEY[,KEY]         require one of these keys (all endpoints but /health)
  --api-key-file FILE         keys, one a line
  --ssl-cert-file, --ssl-key-file FILE
                              serve HTTPS with this PEM certificate and key (both needed)
  --cors-origins ORIGINS      allowed origins (default *; 'localhost': localhost, 127.0.0.1
                              and [::1] on any port; localhost by default with tools on)
  --cors-methods, --cors-headers LIST, --cors-credentials / --no-cors-credentials
                              the other CORS headers, as llama-server's
  -to, --timeout SECONDS      read/write timeout towards the children (default 3600)
  --sleep-idle-seconds N      children unload their model after N idle seconds
  --mcp-servers-config FILE, --mcp-servers-json JSON
                              MCP servers (Cursor's "mcpServers" format) that the agent runs
                              for GET/POST /tools; never passed to the children
  --ui-mcp-proxy              serve /cors-proxy for the web UI's remote MCP servers
  --tools TOOL[,TOOL] | all   llama.cpp's built-in tools (read_file, file_glob_search,
                              grep_search, exec_shell_command, write_file, edit_file,
                              get_info) for GET/POST /tools; they run programs: trusted use only
  --tools-runtime WHERE       where they run: docker:IMAGE, podman:IMAGE (a container for the
                              agent's life), docker-container:ID, podman-container:ID, ssh:TARGET
  -ag, --agent / -no-ag, --no-agent
                              all the built-in tools and --ui-mcp-proxy (or neither)

Corral's own:
  --llama-server PATH         the llama-server binary (else $LLAMA_SERVER, PATH, the build of
                              `corral llama-server build`)
  --models-memory-margin MiB  turn the memory ledger on: keep MiB free on every device
  --memory-limit DEV=SIZE     cap what models may use on a device (host=8GiB, CUDA0=20GiB)
  --load-timeout SECONDS      kill a child not ready after this long (default 600)
  --max-body-size SIZE        refuse request bodies larger than this with 413 (default 64MiB)
  --max-download-size SIZE    refuse to download a model file larger than this (e.g. 40GiB)
  --download-redirect-hosts H[,H]
                              hosts a download may be redirected to (.example.com: a domain);
                              its own host and Hugging Face's CDN always are
  --models-ttl DURATION       unload a model idle this long: 600, 10m, 1h (0, -1: never;
                              a preset's ttl wins)
  --queue-timeout SECONDS     a request waiting longer for its model gets 503 + Retry-After
  --max-queue N               at most N requests wait per model; more get 503 + Retry-After
  --warm-cache-size SIZE      prompt caches saved at an unload and restored at the next load
                              of the same model (warm swaps) use at most this much disk
                              (default 2GiB; 0: off)
  --max-child-errors N        a child that fails N requests in a row with its own 5xx, or
                              stalls one for --timeout, is killed as wedged and loads again
                              when asked (default 5; 0: only stalls)
  --shutdown-timeout SECONDS  on SIGTERM: drain and stop within this long, then kill (default
                              30; a second SIGTERM/SIGINT kills at once)
  --client-timeout SECONDS    a client must send its request head or body, or take streamed
                              data, within this long; idle connections close (default 30)
  --max-connections N         at most N client connections (default: from ulimit -n); idle
                              and slow ones are closed first, so /health keeps answering
  --log-level LEVEL           debug, info, warning or error (default info)
  --peer URL                  another agent (http://HOST:PORT; repeatable): a request for a
                              model not loaded here goes, in one hop, to the peer where it is
                              loaded, sleeping or loading, or that has a free slot for it;
                              peers are asked with this agent's --api-key (one key for all)
  --peers-from-service [NAMESPACE/]NAME
                              on Kubernetes: the peers are the serving agents behind this
                              headless Service, kept live from its EndpointSlices (namespace:
                              the pod's own; this agent left out by $POD_NAME / $POD_IP);
                              with --peer too
  --kube-api URL              the Kubernetes API for --peers-from-service, asked as is (e.g.
                              kubectl proxy's http://127.0.0.1:8001; default: in-cluster, with
                              the pod's service-account token and CA)
  --allowed-hosts NAMES       Host names answered besides local ones (comma-separated; '*':
                              no check; default: a loopback-bound agent answers only to
                              localhost names and IP literals, a guard against DNS rebinding)

Any other option is a llama-server option: it is passed to every child (e.g. -c 4096) and
overrides the presets' values.
"""


def _toolbox(options: AgentOptions) -> Toolbox | None:
    """The built-in tools, imported only when the agent's own flags turn them on."""
    if not (options.tools or options.tools_runtime):
        return None
    from node_agent.tools.toolbox import Toolbox

    return Toolbox(options.tools, options.tools_runtime)


def download_settings(options: AgentOptions, env: Mapping[str, str]) -> DownloadSettings:
    """``--hf-token`` (else ``$HF_TOKEN``), the endpoint and cache from ``env``, the limits."""
    token = dict(options.child_options).get("hf-token")
    return DownloadSettings(
        env=dict(env),
        token=token if isinstance(token, str) and token else env.get("HF_TOKEN") or None,
        limits=Limits(options.max_download_size, options.download_redirect_hosts),
        load_timeout=options.load_timeout,
    )


def child_config(
    spec: ModelSpec, binary: Path, load_timeout: float = 600.0, tag: str | None = None
) -> ChildConfig:
    """How a model's child is started: its arguments, its own environment, its timeouts."""
    return ChildConfig(
        name=spec.name,
        binary=binary,
        args=("--alias", spec.name, *spec.argv()),
        env=dict(spec.env),
        stop_timeout=spec.stop_timeout,
        load_timeout=load_timeout,
        agent_tag=tag,
    )


class Agent:
    """One running agent: its catalog, registry, proxy and HTTP site."""

    def __init__(
        self, options: AgentOptions, binary: Path, build_info: str, env: Mapping[str, str]
    ) -> None:
        self.options = options
        self.binary = binary
        self.build_info = build_info  # the binary's, as llama.cpp's router reports its own
        self.env = dict(env)
        # Children carry the agent's address: an agent restarted on the same port finds and
        # ends the orphans a SIGKILLed predecessor may have left.
        self.tag = f"{options.host}:{options.port}"
        self.catalog = self._read_catalog()
        self.memory = self._memory_watch(options)
        self.proxy = Proxy(timeout=options.timeout, client_timeout=options.client_timeout)
        self.registry = Registry(
            self.catalog,
            models_max=options.models_max,
            child_factory=self._make_child,
            memory=self.memory,
            ttl=options.models_ttl,
            queue_timeout=options.queue_timeout,
            max_queue=options.max_queue,
            child_errors=options.max_child_errors,
            release_port=self.proxy.release_port,
            shutdown_timeout=options.shutdown_timeout,
            downloads=download_settings(options, self.env),
            warm=self._warm_swaps(options),
        )
        self.registry.downloads.on_finished = self.reload  # a download becomes a cache model
        self.peers = (
            Peers(
                options.peers,
                agent_id=self.env.get("NODE_NAME") or self.tag,
                api_key=options.api_keys[0] if options.api_keys else None,
                registry=self.registry,
                models_max=options.models_max,
                proxy=self.proxy,
                timeout=options.timeout,
            )
            if options.peers or options.peers_from_service
            else None
        )
        self.discovery = self._peer_discovery() if self.peers is not None else None
        self.logs: dict[str, LogRing] = {}
        servers = load_servers(options.mcp_servers_config, options.mcp_servers_json)
        self.mcp = McpServers(servers) if servers else None
        self.builtin_tools = _toolbox(options)
        # llama.cpp's rule (arg.cpp): built-in tools or MCP servers given make `localhost` the
        # CORS default.
        self._tools_enabled = bool(
            options.tools or options.mcp_servers_config or options.mcp_servers_json
        )
        self._runner: web.AppRunner | None = None
        self._tasks = TaskSet("agent")
        preset = options.models_preset
        # A directory is the operator's ConfigMap: watched, and reloaded when it changes.
        self._preset_dir = Path(preset) if preset and Path(preset).is_dir() else None
        self.port: int | None = None
        # Hot reload of the models folder, a preset file and the HF cache (source_watch.py).
        watched = watched_paths(options.models_dir, preset, hub_dir(self.env))
        self.source_watch = SourceWatch(watched, self.reload)

    def _read_catalog(self) -> Catalog:
        hub = hub_dir(self.env)
        catalog = load_catalog(
            hub=hub,
            models_dir=self.options.models_dir,
            preset_files=preset_files(self.options.models_preset, self.env.get("NODE_NAME")),
            cli_options=self.options.child_options,
            restricted=preset_policy(
                self.options.models_preset, [self.options.models_dir, hub, cache_dir(self.env)]
            ),
        )
        for refusal in catalog.refused:
            log.error(
                "preset refused (it cannot be applied; the others stay): %s: %s",
                refusal.origin,
                refusal.reason,
            )
        return catalog

    def _peer_discovery(self) -> PeerDiscovery | None:
        """``--peers-from-service``: the watch that keeps the peer set (errors before start)."""
        if self.options.peers_from_service is None or self.peers is None:
            return None
        # Imported only when on: nothing of Kubernetes' at an ordinary start.
        from node_agent.api.peer_discovery import PeerDiscovery, kube_api, service_namespace
        from node_agent.core.endpoint_slices import Me, SliceView

        namespace, service = self.options.peers_from_service
        me = Me(pod_name=self.env.get("POD_NAME") or None, pod_ip=self.env.get("POD_IP") or None)
        if me == Me():
            raise ConfigError(
                "--peers-from-service needs $POD_NAME or $POD_IP (the downward API) to leave "
                "this agent out of its own peers"
            )
        scheme = "https" if self.options.ssl_cert_file else "http"
        return PeerDiscovery(
            kube_api(self.options.kube_api, self.env),
            service_namespace(namespace, self.env),
            service,
            SliceView(me, scheme),
            self.peers.use_discovered,
        )

    def _warm_swaps(self, options: AgentOptions) -> WarmSwaps | None:
        """The warm folder, unless --warm-cache-size 0 turned warm swaps off."""
        if options.warm_cache_size <= 0:
            return None
        return WarmSwaps(warm_folder(dict(self.env)), options.warm_cache_size, self.binary)

    @staticmethod
    def _memory_watch(options: AgentOptions) -> MemoryWatch | None:
        """The ledger is on with ``--models-memory-margin`` or any ``--memory-limit``."""
        if options.models_memory_margin is None and not options.memory_limits:
            return None
        from node_agent.memory.devices import open_probes
        from node_agent.runtime.memory_watch import MemoryWatch

        probe = open_probes()
        found = [reading.name for reading in probe.read()]
        unknown = [device for device, _ in options.memory_limits if device not in found]
        if unknown:  # a cap on a device the ledger cannot see would silently cap nothing
            gpus = ""
            if not any(d != "host" for d in found):
                gpus = (
                    "; NVML found no NVIDIA GPU (is its driver loaded?)"
                    if importlib.util.find_spec("pynvml")
                    else f"; the ledger sees GPUs through NVML: {install_hint('nvidia')}"
                )
            raise ConfigError(
                f"--memory-limit names {', '.join(unknown)}, which this machine does not have "
                f"(devices: {', '.join(found)}){gpus}"
            )
        watch = MemoryWatch(
            margin_mib=options.models_memory_margin or 0,
            limits=dict(options.memory_limits),
            probe=probe,
        )
        log.info("memory ledger on: devices %s", ", ".join(watch.devices))
        return watch

    def _make_child(self, spec: ModelSpec, on_event: Callable[[ChildEvent], None]) -> ChildProcess:
        config = child_config(spec, self.binary, self.options.load_timeout, self.tag)
        return ChildProcess(config, on_event=on_event, logs=self.logs_for(spec.name))

    def refused_presets(self) -> list[RefusedPreset]:
        """The current catalog's refused presets, for ``GET /models``."""
        from node_agent.models_schema import RefusedPreset  # pydantic: lazily (start-up time)

        return [
            RefusedPreset(origin=r.origin, reason=r.reason, models=list(r.models))
            for r in self.catalog.refused
        ]

    def logs_for(self, name: str) -> LogRing:
        """The model's log ring: one per model, kept across restarts (a crash's last lines
        stay readable through ``GET /models/logs``)."""
        return self.logs.setdefault(name, LogRing(LOG_LINES))

    async def reload(self) -> None:
        """``GET /models?reload=1``: re-read every source and apply the difference.

        Sources that cannot be read change nothing: the running catalog stays as it was.
        """
        try:
            new = keep_refused(self.catalog, await asyncio.to_thread(self._read_catalog))
        except ConfigError as exc:
            raise ApiError(500, f"reload failed, nothing was changed: {exc}") from exc
        diff = diff_catalogs(self.catalog, new)
        self.catalog = new
        log.info(
            "reloaded: %d added, %d removed, %d to restart, %d updated in place",
            len(diff.added),
            len(diff.removed),
            len(diff.changed),
            len(diff.updated),
        )
        await self.registry.reload(new, set(diff.changed))
        fresh = [new[name] for name in (*diff.added, *diff.changed)]  # their files, as at start
        if fresh and not self._tasks.statistics().closed:  # (a reload during the shutdown)
            self._tasks.spawn(asyncio.to_thread(log_model_file_problems, fresh), "model-files")

    async def watch_presets(self, directory: Path) -> None:
        """Reload when the operator's ConfigMap volume changes (the kubelet's ``..data`` swap)."""
        seen = directory_version(directory)
        while True:
            await asyncio.sleep(PRESET_POLL_SECONDS)
            version = directory_version(directory)
            if version == seen:
                continue
            seen = version
            try:
                await self.reload()
            except ApiError as exc:
                log.error("presets changed but cannot be applied: %s", exc.message)

    async def start(self) -> None:
        tls = startup.tls_context(self.options)  # a bad file is an error before anything runs
        ended = await asyncio.to_thread(end_orphans, self.tag)
        if ended:
            log.warning("ended orphaned llama-server children of a previous agent: %s", ended)
        settings = RouterSettings(
            models_max=self.options.models_max,
            models_autoload=self.options.models_autoload,
            api_keys=tuple(self.options.api_keys),
            build_info=self.build_info,
            max_body_bytes=self.options.max_body_size,
            client_timeout=self.options.client_timeout,
            browser=startup.browser_policy(self.options, tools_enabled=self._tools_enabled),
            vertex=vertex_from_env(self.env),
            cors_proxy=self.options.ui_mcp_proxy,
        )
        if self.builtin_tools is not None:
            await self.builtin_tools.start()  # its container, before listening
        if self.mcp is not None:
            await self.mcp.warm_up()  # before listening, as llama.cpp does
        state = AgentState(
            self.registry,
            self.proxy,
            settings,
            self.reload,
            str(self.binary),
            self.logs_for,
            mcp_servers=self.mcp,
            builtin_tools=self.builtin_tools,
            peers=self.peers,
            refused=self.refused_presets,
        )
        app = build_app(state)
        setup_ollama(app)  # Ollama's /api/* on the same registry (node_agent/ollama/)
        app.cleanup_ctx.append(self._lifetime)
        # handler_cancellation: a client that goes away cancels its handler, so a queued
        # request leaves the queue and a proxied one closes its connection to the child.
        # shutdown_timeout: handlers still running when the shutdown's bound has passed are
        # cancelled (aiohttp's default would wait 60 s more).
        # keepalive_timeout: also bounds a connection that sends no head, or a slow one
        # (api/connections.py).
        self._runner = BoundedRunner(
            app,
            max_connections=self.options.max_connections or default_max_connections(),
            keepalive_timeout=self.options.client_timeout,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self.options.shutdown_timeout,
        )
        await self._runner.setup()
        try:
            listening = await startup.listen(
                self._runner, self.options.host, self.options.port, tls
            )
        except ConfigError:
            # The process ends with that one line: first stop what setup started (children
            # spawned for load-on-startup meanwhile, the proxy's and helpers' sessions).
            self.registry.begin_close()
            await self._runner.cleanup()
            raise
        self.port = listening.port
        log.warning("%s", security_warning(self.mcp, self.options.ui_mcp_proxy, self.builtin_tools))
        # With the ledger on, every first load estimates its model: gguf (and numpy) too.
        later = IMPORTED_LATER if self.memory is None else (*IMPORTED_LATER, ESTIMATOR)
        self._tasks.spawn(asyncio.to_thread(_import_all, later), "imports")
        for warning in startup.source_warnings(self.options, self.env, self.catalog):
            log.warning("%s", warning)
        specs = list(self.catalog.values())
        self._tasks.spawn(asyncio.to_thread(log_model_file_problems, specs), "model-files")
        tools_default = self._tools_enabled and self.options.cors_origins is None
        for warning in start_warnings(
            settings.browser, settings.api_keys, tools_default=tools_default
        ):
            log.warning("%s", warning)
        log.info("listening on %s (%d models)", listening.url, len(self.catalog))

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp's cleanup context: the registry and the proxy live as long as the app."""
        self.registry.start()
        if self._preset_dir is not None:
            self._tasks.spawn(self.watch_presets(self._preset_dir), "preset-watch", forever=True)
        self._tasks.spawn(self.source_watch.run(), "source-watch", forever=True)
        if self.peers is not None:
            self._tasks.spawn(self.peers.run(), "peer-poll", forever=True)
        if self.discovery is not None:
            self._tasks.spawn(self.discovery.run(), "peer-discovery", forever=True)
        yield
        await self._tasks.close()
        await self.registry.close()
        await self.proxy.close()
        if self.mcp is not None:
            await self.mcp.close()
        if self.builtin_tools is not None:
            await self.builtin_tools.close()  # removes the --tools-runtime container
        if self.peers is not None:
            await self.peers.close()

    async def stop(self) -> None:
        """Begin closing the registry first (from here on every request is refused, nothing
        is spawned and every model drains), end the MCP servers and the built-in tools, then
        let aiohttp stop listening, wait for the handlers and run the cleanup context (where
        the registry waits for its children to exit)."""
        log.info(
            "shutting down: refusing new requests, draining and stopping children "
            "(at most %gs; a second signal kills them now)",
            self.options.shutdown_timeout,
        )
        self.registry.begin_close()
        if self.mcp is not None:
            await self.mcp.close()
        if self.builtin_tools is not None:
            await self.builtin_tools.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def force_stop(self, why: str) -> None:
        """The bound passed or a second signal came: kill the children, then finish."""
        log.warning("forcing the shutdown (%s): killing the children", why)
        self.registry.kill()


def _import_all(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)


def _watch_children_with_pidfds() -> None:
    """Python 3.11's default child watcher starts a thread per child to wait for it; a pidfd
    is watched by the event loop itself (3.12 does this on its own). Linux 5.3+ only."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # an older kernel: keep the threaded watcher
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


# After a forced stop, the cleanup still has this long to reap the killed children.
FORCED_CLEANUP_SECONDS = 5.0


async def serve(
    options: AgentOptions, binary: Path, build_info: str, env: Mapping[str, str]
) -> None:
    _watch_children_with_pidfds()
    agent = Agent(options, binary, build_info, env)
    first, second = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (second if first.is_set() else first).set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    # SIGHUP: re-read the sources, as daemons do (it used to end the agent without a word).
    loop.add_signal_handler(signal.SIGHUP, agent.source_watch.request, "SIGHUP")
    await agent.start()
    await first.wait()
    stopping = asyncio.create_task(agent.stop(), name="shutdown")
    forced = asyncio.create_task(second.wait(), name="second-signal")
    done, _ = await asyncio.wait(
        {stopping, forced}, timeout=options.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    forced.cancel()
    if stopping in done:
        stopping.result()
        return
    why = (
        "a second signal"
        if second.is_set()
        else f"--shutdown-timeout {options.shutdown_timeout:g}s"
    )
    agent.force_stop(why)
    _, pending = await asyncio.wait({stopping}, timeout=FORCED_CLEANUP_SECONDS)
    for task in pending:
        task.cancel()


def with_vertex(options: AgentOptions, env: Mapping[str, str]) -> AgentOptions:
    """Google Cloud's ``AIP_HTTP_PORT`` replaces ``--port`` (llama.cpp's server-http.cpp)."""
    vertex = vertex_from_env(env)
    if vertex is None or vertex.port == options.port:
        return options
    log.warning(
        "Google Cloud Platform compat: overriding server port %d with AIP_HTTP_PORT %d",
        options.port,
        vertex.port,
    )
    return dataclasses.replace(options, port=vertex.port)


SWITCH_INTERVAL = 0.0005  # seconds (CPython's default: 0.005)


def main(argv: Sequence[str], probe: BinaryProbe | None = None) -> int:
    """``corral agent``; ``probe``: the binary's checks, begun before this module imported
    (``cli``)."""
    env = os.environ
    # The binary first: its own --help says which options the flags and presets may use.
    # Without one, --help still works, and the error waits until the flags are checked.
    binary, binary_version, missing = (probe or BinaryProbe(argv, env)).result()
    try:
        options = parse_agent_args(argv, env)
    except CorralError as exc:
        print(f"corral agent: {exc}", file=sys.stderr)
        return 2
    if options.show_help:
        print(HELP, end="")
        return 0
    if options.show_version:
        from node_agent.version import version_line  # importlib.metadata: only for this

        print(version_line())
        return 0
    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Secrets never reach the log: the keys and the token by value, the rest by shape.
    add_secrets(options.api_keys)
    add_secret(download_settings(options, env).token)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    if missing is not None or binary is None:
        print(f"corral agent: {missing}", file=sys.stderr)
        return 1
    # A thread busy in Python (a model header's estimate, a tool) hands the GIL back every
    # switch interval, and the loop waits that long each time it takes the GIL back after a
    # system call: some twenty times per request. At CPython's 5 ms a /health took 224-288 ms
    # while ten costly estimates ran (issue 26, row 6b); at 0.5 ms the waits stay short.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        options = with_vertex(options, env)
        asyncio.run(serve(options, binary, build_info(binary_version), env))
    except CorralError as exc:
        print(f"corral agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
