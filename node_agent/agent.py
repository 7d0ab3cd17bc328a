"""The agent's parts wired together: the options, the catalog, the registry (the runtime's
owner), the proxy, the HTTP server and the watches of the model sources.

Shutdown, in uvicorn's and aiohttp's order: the registry closes first (every request still
arriving gets 503 with Retry-After, nothing is spawned), the listener stops, requests in
flight drain (each model up to its stop timeout) while the children stop, and aiohttp's
cleanup context ends the registry and the proxy. The process around it (signals, the
shutdown's bound): ``serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import importlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
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
from node_agent.api.routing_metrics import routing_app
from node_agent.api.state import AgentState, RouterSettings
from node_agent.api.tools_api import security_warning
from node_agent.api.vertex import vertex_from_env
from node_agent.api.views import forget_listed
from node_agent.api.wire import gather_window
from node_agent.child.logs import LogRing
from node_agent.child.orphans import end_orphans
from node_agent.child.process import ChildConfig, ChildProcess
from node_agent.child.state import ChildEvent
from node_agent.config import AgentOptions, discovered_scheme
from node_agent.errors import ApiError, ConfigError
from node_agent.event_loop import running_asyncio_loop
from node_agent.extras import install_hint
from node_agent.llama_server.cpu_threads import child_threads
from node_agent.llama_server.devices import env_threads, no_turns_because
from node_agent.mcp.config import load_servers
from node_agent.mcp.servers import McpServers
from node_agent.model_files import log_model_file_problems
from node_agent.ollama.routes import setup_ollama
from node_agent.runtime.model_downloads import DownloadSettings
from node_agent.runtime.registry import Registry
from node_agent.runtime.warm_swaps import WarmSwaps
from node_agent.source_watch import SourceWatch, watched_paths
from node_agent.sources.catalog import (
    Catalog,
    Refusal,
    diff_catalogs,
    keep_refused,
    load_catalog,
)
from node_agent.sources.download import Limits, cache_dir
from node_agent.sources.hf_cache import hub_dir
from node_agent.sources.preset_dir import directory_version, preset_files, preset_policy
from node_agent.sources.spec import ModelSpec, merge_options
from node_agent.state_home import state_home

if TYPE_CHECKING:  # imported lazily (start-up time): pydantic, the memory ledger, peer discovery
    from node_agent.api.peer_discovery import PeerDiscovery
    from node_agent.models_schema import RefusedPreset
    from node_agent.runtime.memory_watch import MemoryWatch
    from node_agent.tools.toolbox import Toolbox

log = logging.getLogger("corral.agent")

LOG_LINES = 2000  # stderr lines kept per model
# Imported in the background once the agent listens: the first request's metrics need them,
# start-up does not (prometheus_client). Not the schema of GET /models (pydantic: 8 MiB of
# the agent's memory, measured): a listing needs it only for downloads and refused presets,
# which most agents never have.
IMPORTED_LATER = ("node_agent.api.metrics_families",)
ESTIMATOR = "node_agent.memory.estimator"
# The routing metrics' scrapers: an InferencePool's endpoint pickers keep one connection each.
ROUTING_CONNECTIONS = 16
# A reload that removes this many models gives the memory they held back (_give_memory_back).
HEAP_TRIM_REMOVED = 1000
PRESET_POLL_SECONDS = 1.0  # the kubelet syncs ConfigMap volumes every ~60 s: 1 s is plenty


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
        records=state_home(env) / "downloads",
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
        self,
        options: AgentOptions,
        binary: Path,
        build_info: str,
        env: Mapping[str, str],
        devices: tuple[str, ...] | None = None,
    ) -> None:
        """``devices``: what the binary's children may compute on besides the CPU
        (``--list-devices``; None: unknown)."""
        self.options = options
        self.binary = binary
        self.build_info = build_info  # the binary's, as llama.cpp's router reports its own
        self.env = dict(env)
        # Children carry the agent's address: an agent restarted on the same port finds and
        # ends the orphans a SIGKILLed predecessor may have left.
        self.tag = f"{options.host}:{options.port}"
        self.catalog = self._read_catalog()
        self.memory = self._memory_watch(options)
        # Where the children compute on the CPU alone, each runs a thread per core but one
        # unless LLAMA_ARG_THREADS or its own options say (llama_server/cpu_threads.py); the
        # models whose child runs several threads take turns.
        no_turns = no_turns_because(devices) if options.cpu_turns > 0 else None
        given = env_threads(self.env)
        cpu_only = no_turns_because(devices) is None
        self.child_threads = child_threads() if cpu_only and given is None else None
        self.proxy = Proxy(
            timeout=options.timeout,
            client_timeout=options.client_timeout,
            stream_gather=gather_window(options.stream_gather),
        )
        self.registry = Registry(
            self.catalog,
            models_max=options.models_max,
            child_factory=self._make_child,
            memory=self.memory,
            ttl=options.models_ttl,
            queue_timeout=options.queue_timeout,
            max_queue=options.max_queue,
            child_errors=options.max_child_errors,
            probe_timeout=options.timeout,
            release_port=self.proxy.release_port,
            shutdown_timeout=options.shutdown_timeout,
            downloads=download_settings(options, self.env),
            warm=self._warm_swaps(options),
            cpu_turn=0.0 if no_turns else options.cpu_turns,
            child_threads=given or self.child_threads,
        )
        self._no_turns = no_turns  # said once it listens (start's errors are one line)
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
                tls=startup.peer_tls_context(options),
                server_name=options.peer_server_name,
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
        self._routing_runner: web.AppRunner | None = None
        self._tasks = TaskSet("agent")
        preset = options.models_preset
        # A directory is the operator's ConfigMap: watched, and reloaded when it changes.
        self._preset_dir = Path(preset) if preset and Path(preset).is_dir() else None
        self.port: int | None = None
        # Hot reload of the models folder, a preset file and the HF cache (source_watch.py).
        watched = watched_paths(options.models_dir, preset, hub_dir(self.env))
        self.source_watch = SourceWatch(watched, self.reload)

    def _read_catalog(self, known: Collection[Refusal] | None = None) -> Catalog:
        """Read every source; each refusal not ``known`` (the running catalog's) is logged
        once, not at every re-read of the sources (a poll re-reads them twice a second).
        ``known`` is None at start, where a clash of the administrator's presets stops the
        agent (llama.cpp's router does); on a reload it refuses that preset alone."""
        hub = hub_dir(self.env)
        catalog = load_catalog(
            hub=hub,
            models_dir=self.options.models_dir,
            preset_files=preset_files(self.options.models_preset, self.env.get("NODE_NAME")),
            cli_options=self.options.child_options,
            restricted=preset_policy(
                self.options.models_preset, [self.options.models_dir, hub, cache_dir(self.env)]
            ),
            refuse_clashes=known is not None,
        )
        for refusal in catalog.refused:
            if known is None or refusal not in known:
                log.error(
                    "%s refused (it cannot be applied; the others stay): %s: %s",
                    refusal.kind,
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
        scheme = discovered_scheme(self.options.ssl_cert_file)
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
        return WarmSwaps(
            state_home(self.env) / "warm",
            options.warm_cache_size,
            self.binary,
            keyed=bool(options.api_keys),
        )

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

    def _missing_gpus(self) -> str | None:
        """Why the agent is not ready, when it sees fewer GPUs than ``--expect-gpus`` (said
        once, as an error; ``/health`` then answers 503 with it)."""
        if not self.options.expect_gpus:
            return None
        from node_agent.memory.devices import missing_gpus, open_probes

        probe = self.memory.probe if self.memory is not None else open_probes()
        problem = missing_gpus(self.options.expect_gpus, probe)
        if problem is not None:
            log.error("not ready: %s", problem)
        return problem

    def _make_child(self, spec: ModelSpec, on_event: Callable[[ChildEvent], None]) -> ChildProcess:
        if self.child_threads is not None and not spec.chooses_threads:
            threads = (("threads", str(self.child_threads)),)
            spec = dataclasses.replace(spec, options=merge_options(spec.options, threads))
        config = child_config(spec, self.binary, self.options.load_timeout, self.tag)
        return ChildProcess(config, on_event=on_event, logs=self.logs_for(spec.name))

    def refused_presets(self) -> list[RefusedPreset]:
        """The current catalog's refused presets, for ``GET /models``."""
        if not self.catalog.refused:
            return []  # (pydantic, 8 MiB, only for an agent that has something to say)
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
            read = await asyncio.to_thread(self._read_catalog, self.catalog.refused)
            new = keep_refused(self.catalog, read)
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
        if len(diff.removed) >= HEAP_TRIM_REMOVED:
            _give_memory_back()
        fresh = [new[name] for name in (*diff.added, *diff.changed)]  # their files, as at start
        if fresh and not self._tasks.statistics().closed:  # (a reload during the shutdown)
            self._tasks.spawn(log_model_file_problems(fresh), "model-files")

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
            unready=self._missing_gpus(),
            metrics_keys=self.options.metrics_keys,
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
            if self.options.routing_metrics_port is not None:
                await self._serve_routing_metrics(self.options.routing_metrics_port)
        except ConfigError:
            # The process ends with that one line: first stop what setup started (children
            # spawned for load-on-startup meanwhile, the proxy's and helpers' sessions).
            self.registry.begin_close()
            if self._routing_runner is not None:
                await self._routing_runner.cleanup()
            await self._runner.cleanup()
            raise
        self.port = listening.port
        log.warning("%s", security_warning(self.mcp, self.options.ui_mcp_proxy, self.builtin_tools))
        # With the ledger on, every first load estimates its model: gguf (and numpy) too.
        later = IMPORTED_LATER if self.memory is None else (*IMPORTED_LATER, ESTIMATOR)
        self._tasks.spawn(_import_then_freeze(later), "imports")
        for warning in startup.source_warnings(self.options, self.env, self.catalog):
            log.warning("%s", warning)
        specs = list(self.catalog.values())
        self._tasks.spawn(log_model_file_problems(specs), "model-files")
        tools_default = self._tools_enabled and self.options.cors_origins is None
        for warning in start_warnings(
            settings.browser, settings.api_keys, tools_default=tools_default
        ):
            log.warning("%s", warning)
        loop = "asyncio" if running_asyncio_loop() else "uvloop"
        log.info(
            "listening on %s (%d models; event loop: %s)", listening.url, len(self.catalog), loop
        )
        if self.child_threads is not None:
            log.info(
                "children compute on the CPU alone: each runs %d thread%s, a core is left to "
                "the rest of the machine (a model's own -t wins; one of a single thread takes "
                "no turns)",
                self.child_threads,
                "" if self.child_threads == 1 else "s",
            )
        if self._no_turns:
            log.info("models compute at once, without turns (--cpu-turns): %s", self._no_turns)
        elif self.registry.scheduler.turn > 0:
            log.info(
                "models whose child runs several threads take turns on the CPU of at most %gs "
                "(--cpu-turns; 0: off)",
                self.registry.scheduler.turn,
            )
        # Only once it listens: an agent that cannot start says that in one line, no more.
        self._tasks.spawn(self.source_watch.run(), "source-watch", forever=True)

    async def _serve_routing_metrics(self, port: int) -> None:
        """``--routing-metrics-port``: a listener of its own, no keys, no TLS (only the
        figures of api/routing_metrics.py are there), few connections (its scrapers')."""
        self._routing_runner = BoundedRunner(
            routing_app(self.registry.scheduler, self.registry.downloads),
            max_connections=ROUTING_CONNECTIONS,
            keepalive_timeout=self.options.client_timeout,
            handler_cancellation=True,
            access_log=None,
        )
        await self._routing_runner.setup()
        try:
            listening = await startup.listen(self._routing_runner, self.options.host, port)
        except ConfigError as exc:
            raise ConfigError(f"--routing-metrics-port: {exc.message}") from exc
        log.info("routing metrics (no credentials) on %s/metrics", listening.url)

    async def _lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp's cleanup context: the registry and the proxy live as long as the app."""
        self.registry.start()
        if self._preset_dir is not None:
            self._tasks.spawn(self.watch_presets(self._preset_dir), "preset-watch", forever=True)
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
        if self._routing_runner is not None:
            await self._routing_runner.cleanup()
        if self._runner is not None:
            await self._runner.cleanup()

    def force_stop(self, why: str) -> None:
        """The bound passed or a second signal came: kill the children, then finish."""
        log.warning("forcing the shutdown (%s): killing the children", why)
        self.registry.kill()


async def _import_then_freeze(modules: Sequence[str]) -> None:
    """The last of start-up: then what it made (modules, the catalog, the app), which lives as
    long as the agent, goes out of the collector's sight, and the collector (off since the
    command began: cli._agent) comes back on.

    A full collection walked it all: 43 and 46 ms, once in each of two runs of 15 streamed
    answers of 256 tokens; and during start-up, 37 ms before the agent listened and 59 ms in
    a GET /models just after, with 1,000 models (issue 30). Nothing start-up makes is garbage
    worth looking for."""
    try:
        await asyncio.to_thread(_import_all, modules)
    finally:
        gc.freeze()
        gc.enable()


def _give_memory_back() -> None:
    """After many models left the catalog (10,000 files deleted): drop what the listing
    kept of them, collect, and hand the freed heap back to the system. Without it the agent
    stayed at its peak (RSS 75 -> 147 MiB, and there after the files went: issue 50, row 7);
    glibc keeps freed memory in its arenas until ``malloc_trim``. Elsewhere, only the first
    two steps."""
    forget_listed()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _import_all(modules: Sequence[str]) -> None:
    for module in modules:
        importlib.import_module(module)
