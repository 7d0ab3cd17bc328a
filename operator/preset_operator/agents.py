"""Agent pods and polling their ``GET /models``.

One poll per interval for all agents together, from the reconciler's single loop (no per-object
timers): with N nodes that is N small GETs, concurrently, each bounded by a timeout so one hung
agent cannot delay the others' status.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import aiohttp

from .status import AgentReport, parse_models


@dataclass(frozen=True)
class AgentPod:
    name: str
    node: str | None  # spec.nodeName (None until scheduled)
    ip: str | None  # status.podIP (None until it has one)
    labels: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    resource_version: str | None = None  # to tell a stale index entry (relist.py)


AgentUrl = Callable[[AgentPod], str | None]


@dataclass(frozen=True)
class AgentTls:
    """The agents serve HTTPS: their certificates are checked against ``context``'s CAs and,
    when given, by ``server_name`` instead of the pod IP (which no certificate names: the
    chart's names the agents' Service)."""

    context: ssl.SSLContext
    server_name: str | None = None


def pod_url(port: int, *, https: bool = False) -> AgentUrl:
    """The agent's base URL from its pod IP (the production mapping; tests inject their own)."""
    scheme = "https" if https else "http"

    def url(pod: AgentPod) -> str | None:
        if not pod.ip:
            return None
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip  # IPv6 pod IPs
        return f"{scheme}://{host}:{port}"

    return url


async def _poll_one(
    session: aiohttp.ClientSession,
    base: str,
    limit_s: float,
    api_key: str | None,
    tls: AgentTls | None,
) -> tuple[bool, object]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(
            f"{base}/models",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=limit_s),
            ssl=True if tls is None else tls.context,
            server_hostname=None if tls is None else tls.server_name,
        ) as resp:
            if resp.status == 401:
                return False, (
                    "GET /models answered HTTP 401: the agent wants an API key "
                    "(give the operator the agents' key in $LLAMA_API_KEY)"
                )
            if resp.status != 200:
                return False, f"GET /models answered HTTP {resp.status}"
            return True, parse_models(await resp.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return False, f"agent unreachable: {type(exc).__name__}: {exc}"[:500]


async def poll_agents(
    session: aiohttp.ClientSession,
    pods: Iterable[AgentPod],
    url_for: AgentUrl,
    previous: Mapping[str, AgentReport],
    now: dt.datetime,
    limit_s: float,
    api_key: str | None = None,
    tls: AgentTls | None = None,
) -> dict[str, AgentReport]:
    """Poll every scheduled agent; one report per node.

    A failed poll keeps the node's last good answer and its time, adding the error: staleness
    (status.py) then turns it into ``Unknown`` after a while instead of at the first blip. When a
    node has two agent pods (a rolling update), a successful answer wins.
    """
    by_node: dict[str, list[AgentPod]] = {}
    for pod in pods:
        if pod.node and not pod.deleting:
            by_node.setdefault(pod.node, []).append(pod)
    jobs: list[tuple[str, asyncio.Task[tuple[bool, object]]]] = []
    async with asyncio.TaskGroup() as tg:
        for node, node_pods in sorted(by_node.items()):
            for pod in sorted(node_pods, key=lambda p: p.name):
                base = url_for(pod)
                if base is not None:
                    job = _poll_one(session, base, limit_s, api_key, tls)
                    jobs.append((node, tg.create_task(job)))
    reports: dict[str, AgentReport] = {}
    for node, task in jobs:
        ok, result = task.result()
        if ok:
            assert isinstance(result, dict)
            reports[node] = AgentReport(last_seen=now, models=result)
        elif node not in reports or reports[node].error is not None:
            prev = previous.get(node)
            reports[node] = AgentReport(
                last_seen=prev.last_seen if prev else None,
                models=prev.models if prev else {},
                error=str(result),
            )
    for node in by_node:
        if node not in reports:  # no IP yet: nothing new to say
            prev = previous.get(node)
            reports[node] = prev or AgentReport(last_seen=None, error="agent pod has no IP yet")
    return reports
