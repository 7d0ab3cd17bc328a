"""The operator's world in the emulator: nodes, agent pods, the presets ConfigMap, the operator
itself (kopf for real, in a thread), and helpers to read back what it wrote."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock as kmocklib
import kopf
from preset_operator.agents import AgentUrl
from preset_operator.kube import Credentials
from preset_operator.main import run_operator
from preset_operator.reconcile import EVENTS_NAMESPACE, Config

from node_agent.sources.preset_ini import section_hashes
from tests.integration.harness import free_port
from tests.operator.apiserver import OPERATOR_TOKEN

NS = "corral"
CM = "corral-presets"
AGENT_LABELS = {"app.kubernetes.io/name": "corral", "app.kubernetes.io/component": "agent"}
MP_PATH = "/apis/corral.dev/v1alpha1/modelpresets"
API_KEY = "agents-secret-key"


async def get(kmock: Any, path: str) -> dict[str, Any] | None:
    async with kmock.get(path) as resp:
        if resp.status == 404:
            return None
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = await resp.json()
        return result


async def send(kmock: Any, method: str, path: str, body: Any = None) -> None:
    async with kmock.request(method, path, json=body) as resp:
        assert resp.status < 300, await resp.text()


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 20.0) -> Any:
    """Retry an async assertion until it passes (the operator is eventually consistent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            return await check()
        except (AssertionError, KeyError, IndexError):  # a field not written yet counts too
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(name: str, node_name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": dict(labels)},
        "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "corral"}]},
        "status": {"podIP": "127.0.0.1", "phase": "Running"},
    }


async def prepare(kmock: Any, agents: dict[str, str]) -> None:
    """Declare the resources, create the nodes' agent pods ({pod: node}) and the empty
    ConfigMap the chart pre-creates. The nodes themselves are the caller's."""
    with warnings.catch_warnings():
        # kmock 0.8 reads its bundle with importlib.resources.read_binary (deprecated).
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    kmock.resources["corral.dev/v1alpha1/modelpresets"] = kmocklib.ResourceInfo(
        kind="ModelPreset",
        namespaced=False,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status"},
    )
    for name, node_name in agents.items():
        await send(
            kmock, "POST", f"/api/v1/namespaces/{NS}/pods", pod(name, node_name, AGENT_LABELS)
        )
    await send(
        kmock,
        "POST",
        f"/api/v1/namespaces/{NS}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CM, "namespace": NS}},
    )


@contextlib.asynccontextmanager
async def operator_running(
    kmock: Any, agent_url: AgentUrl, poll_interval: float = 0.2
) -> AsyncIterator[str]:
    """The operator (kopf + its loop) against the emulator, with the agents' API key; yields
    the URL of its liveness probe."""

    async def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(kmock.url), insecure=True, token=OPERATOR_TOKEN)

    config = Config(
        namespace=NS,
        configmap=CM,
        poll_interval=poll_interval,
        # Generous against a busy machine: a node turns Unknown after 3 × this without an answer.
        poll_timeout=1.0,
        debounce=0.05,
        agent_api_key=API_KEY,
        liveness=f"http://127.0.0.1:{free_port()}/healthz",
    )
    # kopf runs in a thread with its own event loop: at exit, kopf cancels every task created
    # after its start in its loop — here that would include pytest-asyncio's teardown task and
    # kmock's server tasks.
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                run_operator(
                    config,
                    credentials=Credentials(
                        server=str(kmock.url).rstrip("/"), token=OPERATOR_TOKEN
                    ),
                    login=login,
                    agent_url=agent_url,
                    stop_flag=stop,
                )
            )
        except BaseException as exc:  # reported below
            failure.append(exc)

    thread = threading.Thread(target=run, name="operator", daemon=True)
    thread.start()
    try:
        assert config.liveness is not None
        yield config.liveness
    finally:
        # Stop the operator before kmock goes away (its watch streams would error otherwise).
        stop.set()
        await asyncio.to_thread(thread.join, 15)
    assert not thread.is_alive(), "the operator did not stop"
    assert not failure, failure


def node_models(data: dict[str, str], node: str) -> list[str]:
    """The model names (INI sections) of one node's files in the presets ConfigMap's data."""
    return list(node_sections(data, node))


def node_sections(data: dict[str, str], node: str) -> dict[str, str]:
    """Model name → the hash of its section (what an agent that read it reports), for one
    node's files in the presets ConfigMap's data."""
    index = json.loads(data.get("nodes.json", '{"files": [], "nodes": {}}'))
    keys = [index["files"][i] for i in index["nodes"].get(node, [])]
    return {name: h for key in keys for name, h in section_hashes(data[key], key).items()}


async def configmap(kmock: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(node → the model names in its files, comma-separated; raw data)."""
    data = ((await get(kmock, f"/api/v1/namespaces/{NS}/configmaps/{CM}")) or {}).get("data") or {}
    nodes = json.loads(data.get("nodes.json", '{"nodes": {}}'))["nodes"]
    return {n: ",".join(node_models(data, n)) for n in nodes}, data


async def status(kmock: Any, name: str) -> dict[str, Any]:
    body = await get(kmock, f"{MP_PATH}/{name}")
    assert body is not None
    return body.get("status") or {}


def cond(st: dict[str, Any], ctype: str) -> tuple[str, str]:
    # An assertion (not StopIteration) while the status is not written yet, so eventually() retries.
    found = [c for c in st.get("conditions", []) if c["type"] == ctype]
    assert found, f"no {ctype} condition yet"
    return found[0]["status"], found[0]["reason"]


def cond_message(st: dict[str, Any], ctype: str) -> str:
    found = [c for c in st.get("conditions", []) if c["type"] == ctype]
    assert found, f"no {ctype} condition yet"
    message: str = found[0]["message"]
    return message


async def event_reasons(kmock: Any, name: str) -> list[str]:
    body = await get(kmock, f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events")
    items = (body or {}).get("items") or []
    return [e["reason"] for e in items if e["involvedObject"]["name"] == name]
