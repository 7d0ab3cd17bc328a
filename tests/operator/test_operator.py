"""The operator, with kopf running for real, against kmock's Kubernetes emulator.

Fake agents are tiny aiohttp servers on 127.0.0.1 (one port per agent pod, through the
operator's injectable agent URL). Each answers ``GET /models`` like an agent that has picked up
its node's file from the presets ConfigMap: it reads the ConfigMap from the emulator, resolves
its node's set through nodes.json and lists that file's sections as loaded — i.e. it plays the
kubelet and the agent together. Tests can override a model's status or take an agent down.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kmock as kmocklib
import kopf
import pytest
from preset_operator.agents import AgentPod
from preset_operator.kube import Credentials
from preset_operator.main import run_operator
from preset_operator.reconcile import Config

NS = "corral"
CM = "corral-presets"
AGENT_LABELS = {"app.kubernetes.io/name": "corral", "app.kubernetes.io/component": "agent"}
MP_PATH = "/apis/corral.dev/v1alpha1/modelpresets"


@dataclass
class FakeAgents:
    kmock: Any
    ports: dict[str, int] = field(default_factory=dict)  # pod name → port
    nodes: dict[str, str] = field(default_factory=dict)  # pod name → node
    overrides: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=dict
    )  # node → model → status
    down: set[str] = field(default_factory=set)  # nodes whose agent answers 503
    runners: list[aiohttp.web.AppRunner] = field(default_factory=list)

    async def start(self, pod: str, node: str) -> None:
        async def models(_: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            if node in self.down:
                return aiohttp.web.json_response({"error": "down"}, status=503)
            data = await get(self.kmock, f"/api/v1/namespaces/{NS}/configmaps/{CM}")
            files = (data or {}).get("data") or {}
            key = json.loads(files.get("nodes.json", "{}")).get(node)
            names = re.findall(r"^\[(.+)\]$", files.get(key, ""), re.M) if key else []
            out = []
            for name in names:
                status = self.overrides.get(node, {}).get(name, {"value": "loaded"})
                out.append({"id": name, "object": "model", "status": status, "memory": {"host": 1}})
            return aiohttp.web.json_response({"object": "list", "data": out})

        app = aiohttp.web.Application()
        app.router.add_get("/models", models)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        self.ports[pod] = runner.addresses[0][1]
        self.nodes[pod] = node

    def url(self, pod: AgentPod) -> str | None:
        port = self.ports.get(pod.name)
        return f"http://127.0.0.1:{port}" if port else None


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


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 6.0) -> Any:
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


def preset(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    spec.setdefault("source", {"localPath": {"path": f"/models/{name}.gguf"}})
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": generation,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }


@pytest.fixture
async def cluster(kmock: Any) -> AsyncIterator[tuple[Any, FakeAgents]]:
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
    agents = FakeAgents(kmock)
    for n in (node("gpu-1", gpu="a100"), node("gpu-2", gpu="a100"), node("cpu-1")):
        await send(kmock, "POST", "/api/v1/nodes", n)
    for name, node_name in (("agent-a", "gpu-1"), ("agent-b", "gpu-2"), ("agent-c", "cpu-1")):
        await send(
            kmock, "POST", f"/api/v1/namespaces/{NS}/pods", pod(name, node_name, AGENT_LABELS)
        )
        await agents.start(name, node_name)
    # Not an agent: must never be labelled or polled.
    await send(kmock, "POST", f"/api/v1/namespaces/{NS}/pods", pod("other", "gpu-1", {"app": "x"}))
    # The chart pre-creates the ConfigMap empty.
    await send(
        kmock,
        "POST",
        f"/api/v1/namespaces/{NS}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CM, "namespace": NS}},
    )

    async def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(kmock.url), insecure=True)

    config = Config(namespace=NS, configmap=CM, poll_interval=0.2, poll_timeout=0.2, debounce=0.05)
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
                    credentials=Credentials(server=str(kmock.url).rstrip("/")),
                    login=login,
                    agent_url=agents.url,
                    stop_flag=stop,
                )
            )
        except BaseException as exc:  # reported by the fixture's teardown
            failure.append(exc)

    thread = threading.Thread(target=run, name="operator", daemon=True)
    thread.start()
    try:
        yield kmock, agents
    finally:
        # Stop the operator before kmock goes away (its watch streams would error otherwise).
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        for runner in agents.runners:
            await runner.cleanup()
    assert not thread.is_alive(), "the operator did not stop"
    assert not failure, failure


async def configmap(kmock: Any) -> tuple[dict[str, str], dict[str, str]]:
    """(node → the model names in its file, raw data)."""
    data = ((await get(kmock, f"/api/v1/namespaces/{NS}/configmaps/{CM}")) or {}).get("data") or {}
    index = json.loads(data.get("nodes.json", "{}"))
    models = {n: ",".join(re.findall(r"^\[(.+)\]$", data[key], re.M)) for n, key in index.items()}
    return models, data


async def preset_labels(kmock: Any) -> dict[str, set[str]]:
    out = {}
    for name in ("agent-a", "agent-b", "agent-c", "other"):
        body = await get(kmock, f"/api/v1/namespaces/{NS}/pods/{name}")
        assert body is not None
        labels = body["metadata"].get("labels") or {}
        out[name] = {k.split("/", 1)[1] for k in labels if k.startswith("preset.corral.dev/")}
    return out


async def status(kmock: Any, name: str) -> dict[str, Any]:
    body = await get(kmock, f"{MP_PATH}/{name}")
    assert body is not None
    return body.get("status") or {}


def cond(st: dict[str, Any], ctype: str) -> tuple[str, str]:
    # An assertion (not StopIteration) while the status is not written yet, so eventually() retries.
    found = [c for c in st.get("conditions", []) if c["type"] == ctype]
    assert found, f"no {ctype} condition yet"
    return found[0]["status"], found[0]["reason"]


async def event_reasons(kmock: Any, name: str) -> list[str]:
    body = await get(kmock, f"/api/v1/namespaces/{NS}/events")
    items = (body or {}).get("items") or []
    return [e["reason"] for e in items if e["involvedObject"]["name"] == name]


async def test_presets_nodes_labels_services_and_status(cluster: tuple[Any, FakeAgents]) -> None:
    kmock, agents = cluster

    # 1. Create two presets: one everywhere, one on the A100 nodes.
    await send(kmock, "POST", MP_PATH, preset("small"))
    await send(
        kmock,
        "POST",
        MP_PATH,
        preset(
            "big",
            modelName="org/big:Q4",
            source={"huggingFace": {"repo": "org/big-GGUF", "file": "big-q4.gguf"}},
            placement={"nodeSelector": {"gpu": "a100"}},
            lifecycle={"loadOnStartup": True},
        ),
    )

    async def step1() -> None:
        models, data = await configmap(kmock)
        assert models == {
            "gpu-1": "org/big:Q4,small",
            "gpu-2": "org/big:Q4,small",
            "cpu-1": "small",
        }
        assert len(data) == 3  # two sets (the A100 nodes share one) + nodes.json
        assert "hf-repo = org/big-GGUF\nhf-file = big-q4.gguf\nload-on-startup = true" in "".join(
            data.values()
        )
        assert await preset_labels(kmock) == {
            "agent-a": {"small", "big"},
            "agent-b": {"small", "big"},
            "agent-c": {"small"},
            "other": set(),
        }
        svc = await get(kmock, f"/api/v1/namespaces/{NS}/services/big")
        assert svc is not None
        assert svc["spec"]["selector"] == {**AGENT_LABELS, "preset.corral.dev/big": "true"}
        assert svc["spec"]["ports"] == [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
        ]
        assert svc["metadata"]["ownerReferences"][0] == {
            "apiVersion": "corral.dev/v1alpha1",
            "kind": "ModelPreset",
            "name": "big",
            "uid": "uid-big",
            "controller": True,
        }
        assert await get(kmock, f"/api/v1/namespaces/{NS}/services/small") is not None
        st = await status(kmock, "big")
        assert st["modelName"] == "org/big:Q4" and st["observedGeneration"] == 1
        assert (st["matchedNodes"], st["loadedNodes"]) == (2, 2)
        assert [(n["name"], n["state"], n["memory"]) for n in st["nodes"]] == [
            ("gpu-1", "Loaded", {"host": 1}),
            ("gpu-2", "Loaded", {"host": 1}),
        ]
        assert all(n["lastSeen"].endswith("Z") for n in st["nodes"])
        assert cond(st, "Ready") == ("True", "AllNodesReady")
        assert cond(st, "Degraded") == ("False", "AsExpected")
        assert (await status(kmock, "small"))["loadedNodes"] == 3
        assert await event_reasons(kmock, "big") == ["Ready"]

    await eventually(step1)

    # 2. Update: "big" moves to H100 nodes, of which there are none yet.
    await send(
        kmock,
        "PATCH",
        f"{MP_PATH}/big",
        {"metadata": {"generation": 2}, "spec": {"placement": {"nodeSelector": {"gpu": "h100"}}}},
    )

    async def step2() -> None:
        models, data = await configmap(kmock)
        assert models == {"gpu-1": "small", "gpu-2": "small", "cpu-1": "small"}
        assert len(data) == 2  # one shared set; the old A100 set is gone
        labels = await preset_labels(kmock)
        assert labels["agent-a"] == labels["agent-b"] == {"small"}
        st = await status(kmock, "big")
        assert st["observedGeneration"] == 2 and st["matchedNodes"] == 0 and st["nodes"] == []
        assert cond(st, "Ready") == ("False", "NoMatchingNodes")
        assert await event_reasons(kmock, "big") == ["Ready", "NotReady"]

    await eventually(step2)

    # 3. A node is relabelled to H100: "big" follows it.
    await send(kmock, "PATCH", "/api/v1/nodes/gpu-2", {"metadata": {"labels": {"gpu": "h100"}}})

    async def step3() -> None:
        models, _ = await configmap(kmock)
        assert models["gpu-2"] == "org/big:Q4,small" and models["gpu-1"] == "small"
        assert (await preset_labels(kmock))["agent-b"] == {"small", "big"}
        st = await status(kmock, "big")
        assert (st["matchedNodes"], st["loadedNodes"]) == (1, 1)
        assert cond(st, "Ready") == ("True", "AllNodesReady")

    await eventually(step3)

    # 4. The model crashes on that node: Degraded, with the error, and an event.
    agents.overrides["gpu-2"] = {
        "org/big:Q4": {"value": "unloaded", "failed": True, "exit_code": 134}
    }

    async def step4() -> None:
        st = await status(kmock, "big")
        assert st["nodes"][0]["state"] == "Failed"
        assert st["nodes"][0]["lastError"] == "llama-server exited with code 134"
        assert cond(st, "Ready") == ("False", "NodesFailed")
        assert cond(st, "Degraded") == ("True", "NodesFailed")
        assert "NodesFailed" in await event_reasons(kmock, "big")

    await eventually(step4)
    agents.overrides.clear()

    # 5. An agent stops answering: after the stale window its node is Unknown, not Loaded.
    agents.down.add("cpu-1")

    async def step5() -> None:
        st = await status(kmock, "small")
        states = {n["name"]: n["state"] for n in st["nodes"]}
        assert states == {"cpu-1": "Unknown", "gpu-1": "Loaded", "gpu-2": "Loaded"}
        cpu = next(n for n in st["nodes"] if n["name"] == "cpu-1")
        assert "HTTP 503" in cpu["lastError"] and "lastSeen" in cpu
        assert cond(st, "Degraded") == ("True", "AgentsUnknown")
        assert cond((await status(kmock, "big")), "Ready") == ("True", "AllNodesReady")

    await eventually(step5)
    agents.down.clear()

    # 6. A node is deleted: it leaves the index and the presets' status.
    await send(kmock, "DELETE", "/api/v1/nodes/cpu-1")

    async def step6() -> None:
        models, _ = await configmap(kmock)
        assert set(models) == {"gpu-1", "gpu-2"}
        st = await status(kmock, "small")
        assert st["matchedNodes"] == 2 and cond(st, "Degraded") == ("False", "AsExpected")

    await eventually(step6)

    # 7. A preset is deleted: its Service, labels and sections go.
    await send(kmock, "DELETE", f"{MP_PATH}/big")

    async def step7() -> None:
        models, data = await configmap(kmock)
        assert models == {"gpu-1": "small", "gpu-2": "small"} and len(data) == 2
        assert await get(kmock, f"/api/v1/namespaces/{NS}/services/big") is None
        labels = await preset_labels(kmock)
        assert labels["agent-a"] == labels["agent-b"] == {"small"}

    await eventually(step7)


async def test_invalid_preset_is_reported_and_not_rendered(cluster: tuple[Any, FakeAgents]) -> None:
    # The CRD's CEL rule refuses this; an apiserver without it (or an old CRD) would not.
    kmock, _ = cluster
    await send(kmock, "POST", MP_PATH, preset("bad", args=["--port", "1"]))
    await send(kmock, "POST", MP_PATH, preset("good"))

    async def check() -> None:
        models, _ = await configmap(kmock)
        assert set(models.values()) == {"good"}
        st = await status(kmock, "bad")
        assert cond(st, "Degraded") == ("True", "InvalidSpec")
        assert any("--port" in c["message"] for c in st["conditions"] if c["type"] == "Degraded")
        assert cond(await status(kmock, "good"), "Ready") == ("True", "AllNodesReady")

    await eventually(check)


async def test_missing_configmap_is_created(kmock: Any, cluster: tuple[Any, FakeAgents]) -> None:
    await send(kmock, "DELETE", f"/api/v1/namespaces/{NS}/configmaps/{CM}")
    await send(kmock, "POST", MP_PATH, preset("solo", placement={"nodeSelector": {"gpu": "a100"}}))

    async def check() -> None:
        models, _ = await configmap(kmock)
        assert models == {"gpu-1": "solo", "gpu-2": "solo"}

    await eventually(check)
