"""``corral operator``: command line, and running kopf next to the reconcile loop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from collections.abc import Sequence

import aiohttp

from node_agent.errors import ConfigError
from node_agent.tls_client import ca_context, server_name

from .agents import AgentTls, AgentUrl, pod_url
from .handlers import LoginFn, build_registry, operator_settings
from .kube import Credentials, HttpCluster, load_credentials
from .reconcile import Config, Reconciler, parse_selector

DEFAULT_SELECTOR = "app.kubernetes.io/name=corral,app.kubernetes.io/component=agent"


def parse_args(argv: Sequence[str] | None) -> Config:
    env = os.environ
    p = argparse.ArgumentParser(
        prog="corral operator",
        description="Turn ModelPresets into the presets of the Corral agents on matching nodes. "
        "When the agents have an API key, give it in $LLAMA_API_KEY.",
    )
    p.add_argument(
        "--namespace",
        default=env.get("CORRAL_NAMESPACE") or env.get("POD_NAMESPACE") or "default",
        help="where the agents, the presets ConfigMap and the Services live "
        "(env CORRAL_NAMESPACE, else POD_NAMESPACE, else default)",
    )
    p.add_argument(
        "--presets-configmap",
        default=env.get("CORRAL_PRESETS_CONFIGMAP") or "corral-presets",
        help="the ConfigMap the agents mount "
        "(env CORRAL_PRESETS_CONFIGMAP; default corral-presets)",
    )
    p.add_argument(
        "--agent-selector",
        default=env.get("CORRAL_AGENT_SELECTOR") or DEFAULT_SELECTOR,
        help="labels of the agent pods, k=v[,k=v] "
        f"(env CORRAL_AGENT_SELECTOR; default {DEFAULT_SELECTOR})",
    )
    p.add_argument("--agent-port", type=int, default=8080, help="the agents' HTTP port (8080)")
    p.add_argument(
        "--agent-ca-file",
        metavar="FILE",
        default=env.get("CORRAL_AGENT_CA_FILE") or None,
        help="the agents serve HTTPS: check their certificates against the CA certificates in "
        "this PEM file (env CORRAL_AGENT_CA_FILE; default: plain HTTP)",
    )
    p.add_argument(
        "--agent-server-name",
        metavar="NAME",
        default=env.get("CORRAL_AGENT_SERVER_NAME") or None,
        help="the name in the agents' certificates, checked instead of each pod's IP, e.g. "
        "corral-agent.corral.svc (env CORRAL_AGENT_SERVER_NAME; needs --agent-ca-file)",
    )
    p.add_argument(
        "--poll-interval", type=float, default=10.0, help="seconds between agent polls (10)"
    )
    p.add_argument(
        "--relist-interval",
        type=float,
        # A string default goes through `type` too: a bad value is a usage error, not a crash.
        default=env.get("CORRAL_RELIST_INTERVAL") or "60",
        help="seconds between the operator's own listings of presets, agent pods and Services, "
        "which drop what was deleted while no watch saw it go, e.g. across an apiserver "
        "restart (env CORRAL_RELIST_INTERVAL; default 60)",
    )
    p.add_argument(
        "--no-events",
        action="store_true",
        help="post no Events about ModelPresets (they go to namespace default, the only one the "
        "apiserver accepts for a cluster-scoped object; for installs that may not write there)",
    )
    p.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8081/healthz (none by default)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    ns = p.parse_args(list(argv) if argv is not None else None)
    try:
        selector = parse_selector(ns.agent_selector)
    except ValueError as exc:
        p.error(str(exc))
    if not selector:
        p.error("--agent-selector may not be empty (it would select every pod)")
    if ns.poll_interval <= 0:
        p.error("--poll-interval must be positive")
    if not ns.relist_interval > 0:
        p.error("--relist-interval must be positive")
    tls = None
    try:
        if ns.agent_ca_file is not None:
            name = server_name(ns.agent_server_name) if ns.agent_server_name else None
            tls = AgentTls(ca_context(ns.agent_ca_file, "--agent-ca-file"), name)
        elif ns.agent_server_name is not None:
            p.error("--agent-server-name checks the agents' certificates: give --agent-ca-file")
    except ValueError as exc:
        p.error(f"--agent-server-name expects {exc}, got {ns.agent_server_name!r}")
    except ConfigError as exc:
        p.error(str(exc))
    # The agents' own variable (the chart sets both from one Secret); a key list like the
    # agent's --api-key "k1,k2" authenticates with its first key. Never a flag: a command
    # line is visible to everyone on the node.
    keys = [k.strip() for k in env.get("LLAMA_API_KEY", "").split(",") if k.strip()]
    return Config(
        namespace=ns.namespace,
        configmap=ns.presets_configmap,
        agent_selector=selector,
        agent_port=ns.agent_port,
        poll_interval=ns.poll_interval,
        poll_timeout=min(3.0, ns.poll_interval),
        verbose=ns.verbose,
        agent_api_key=keys[0] if keys else None,
        agent_tls=tls,
        liveness=ns.liveness,
        relist_interval=ns.relist_interval,
        events=not ns.no_events,
    )


async def run_operator(
    config: Config,
    *,
    credentials: Credentials | None = None,
    login: LoginFn | None = None,
    agent_url: AgentUrl | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """kopf (watching, indexing) and the reconcile loop, as siblings; when kopf stops (a signal
    or ``stop_flag``), the loop is cancelled with it.

    The loop task is created before kopf starts on purpose: at exit kopf cancels every task
    created after its own start as "its" sub-task, and the loop must be stopped by us, in order.
    """
    import kopf

    creds = credentials if credentials is not None else load_credentials()
    async with aiohttp.ClientSession() as session:
        url = agent_url or pod_url(config.agent_port, https=config.agent_tls is not None)
        reconciler = Reconciler(config, HttpCluster(session, creds), session, url)
        registry = build_registry(reconciler, login=login)
        async with asyncio.TaskGroup() as tg:
            loop = tg.create_task(reconciler.run(), name="corral reconcile loop")
            try:
                await kopf.operator(
                    registry=registry,
                    settings=operator_settings(),
                    standalone=True,
                    clusterwide=False,
                    namespaces=[config.namespace],
                    stop_flag=stop_flag,
                    # kopf answers 200 while its watchers and the event loop are alive.
                    liveness_endpoint=config.liveness,
                )
            finally:
                loop.cancel()


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if config.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not config.verbose:
        # kopf logs "Handler … succeeded" at INFO for every watch event: a line per agent pod
        # status change (500 a minute at 500 nodes), which says nothing our own lines do not.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        asyncio.run(run_operator(config))
    except KeyboardInterrupt:
        return 130
    return 0


def run(argv: list[str] | None = None) -> int:
    return main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
