"""The operator, with kopf running for real, against kmock's Kubernetes emulator held to the
apiserver's rules (tests/operator/apiserver.py).

Fake agents are tiny aiohttp servers on 127.0.0.1 (one port per agent pod, through the
operator's injectable agent URL), guarded by the API key like real agents. Each answers
``GET /models`` like an agent that has picked up its node's file from the presets ConfigMap,
with entries built from the agent's own schema (tests/operator/agent_models.py): it reads the
ConfigMap from the emulator, resolves its node's set through nodes.json and lists that file's
sections as loaded — i.e. it plays the kubelet and the agent together. Tests can override a
model's state or take an agent down. tests/operator/test_real_agents.py runs real agents.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import pytest
from preset_operator.agents import AgentPod

from tests.operator.agent_models import model_entry, model_list
from tests.operator.apiserver import Access, StrictEmulator
from tests.operator.cluster import (
    AGENT_LABELS,
    API_KEY,
    CM,
    MP_PATH,
    NS,
    cond,
    cond_message,
    configmap,
    event_reasons,
    eventually,
    get,
    node,
    node_sections,
    operator_running,
    pod,
    prepare,
    send,
    status,
)
from tests.operator.presets import preset
from tests.operator.rbac import granted_to

pytestmark = pytest.mark.kmock(cls=StrictEmulator)


@dataclass
class FakeAgents:
    kmock: Any
    ports: dict[str, int] = field(default_factory=dict)  # pod name → port
    # node → model → model_entry() keyword arguments (value, exit_code, error, memory)
    overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # nodes whose agent answers 503
    runners: list[aiohttp.web.AppRunner] = field(default_factory=list)
    operator_liveness: str = ""  # the operator's liveness probe URL, once it runs

    async def start(self, pod: str, node: str) -> None:
        async def models(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {API_KEY}":
                error = {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
                return aiohttp.web.json_response({"error": error}, status=401)
            if node in self.down:
                return aiohttp.web.json_response({"error": "down"}, status=503)
            data = await get(self.kmock, f"/api/v1/namespaces/{NS}/configmaps/{CM}")
            sections = node_sections((data or {}).get("data") or {}, node)
            entries = [
                model_entry(
                    name,
                    preset_hash=sections[name],
                    **self.overrides.get(node, {}).get(name, {"memory": {"host": 1}}),
                )
                for name in sections
            ]
            return aiohttp.web.json_response(model_list(entries))

        app = aiohttp.web.Application()
        app.router.add_get("/models", models)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.runners.append(runner)
        self.ports[pod] = runner.addresses[0][1]

    def url(self, pod: AgentPod) -> str | None:
        port = self.ports.get(pod.name)
        return f"http://127.0.0.1:{port}" if port else None


# As the fake agents report them (tests/operator/agent_models.py): placed on no GPU.
HOST_1 = {
    "min": {"host": 1},
    "max": {"host": 1},
    "effective": {"host": 1},
    "held": {"host": 1},
    "placement": None,
}
AGENTS = {"agent-a": "gpu-1", "agent-b": "gpu-2", "agent-c": "cpu-1"}


@pytest.fixture
async def cluster(kmock: Any) -> AsyncIterator[tuple[Any, FakeAgents]]:
    for n in (node("gpu-1", gpu="a100"), node("gpu-2", gpu="a100"), node("cpu-1")):
        await send(kmock, "POST", "/api/v1/nodes", n)
    await prepare(kmock, AGENTS)
    # Not an agent: must never be labelled or polled.
    await send(kmock, "POST", f"/api/v1/namespaces/{NS}/pods", pod("other", "gpu-1", {"app": "x"}))
    agents = FakeAgents(kmock)
    try:
        for name, node_name in AGENTS.items():
            await agents.start(name, node_name)
        async with operator_running(kmock, agents.url) as liveness:
            agents.operator_liveness = liveness
            yield kmock, agents
    finally:
        for runner in agents.runners:
            await runner.cleanup()
    # Every object the operator sent passed the apiserver's rules.
    assert kmock.refused == []


async def preset_labels(kmock: Any) -> dict[str, set[str]]:
    out = {}
    for name in (*AGENTS, "other"):
        body = await get(kmock, f"/api/v1/namespaces/{NS}/pods/{name}")
        assert body is not None
        labels = body["metadata"].get("labels") or {}
        out[name] = {k.split("/", 1)[1] for k in labels if k.startswith("preset.corral.dev/")}
    return out


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
            env={"CUDA_VISIBLE_DEVICES": "0,1"},
        ),
    )

    async def step1() -> None:
        models, data = await configmap(kmock)
        assert models == {
            "gpu-1": "org/big:Q4,small",
            "gpu-2": "org/big:Q4,small",
            "cpu-1": "small",
        }
        assert len(data) == 3  # one file per preset + nodes.json
        assert "hf-repo = org/big-GGUF\nhf-file = big-q4.gguf\nload-on-startup = true" in "".join(
            data.values()
        )
        assert "\nenv.CUDA_VISIBLE_DEVICES = 0,1\n" in "".join(data.values())
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
            ("gpu-1", "Loaded", HOST_1),
            ("gpu-2", "Loaded", HOST_1),
        ]
        assert {k: v for k, v in st["nodeCounts"].items() if v} == {"Loaded": 2}
        assert all("lastSeen" not in n for n in st["nodes"])  # no heartbeat in the status
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
        assert len(data) == 2  # "big" is placed nowhere: its file is gone
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

    # 4. The model crashes on that node: Degraded, with the child's own error line, and an event.
    crash = "llama_model_load: error loading model: tensor 'output.weight' data is not aligned"
    agents.overrides["gpu-2"] = {
        "org/big:Q4": {"value": "unloaded", "exit_code": 134, "error": crash}
    }

    async def step4() -> None:
        st = await status(kmock, "big")
        assert st["nodes"][0]["state"] == "Failed"
        assert st["nodes"][0]["lastError"] == crash
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
        assert "HTTP 503" in cpu["lastError"]
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
    bad = preset("bad", args=["--port", "1"])
    async with kmock.request("POST", MP_PATH, json=bad) as resp:
        assert resp.status == 422 and "args may only set" in await resp.text()
    kmock.crd_rules = False
    await send(kmock, "POST", MP_PATH, bad)
    await send(kmock, "POST", MP_PATH, preset("good"))

    async def check() -> None:
        models, _ = await configmap(kmock)
        assert set(models.values()) == {"good"}
        st = await status(kmock, "bad")
        assert cond(st, "Degraded") == ("True", "InvalidSpec")
        assert any("--port" in c["message"] for c in st["conditions"] if c["type"] == "Degraded")
        assert cond(await status(kmock, "good"), "Ready") == ("True", "AllNodesReady")

    await eventually(check)


@pytest.mark.parametrize(
    ("args", "source"),
    [
        (["--mcp-servers-json", '{"mcpServers":{"x":{"command":"/bin/sh"}}}'], None),  # row 1
        (["--chat-template-file", "/proc/self/environ"], None),  # row 2
        (["--log-file=/tmp/x", "--tools", "all", "--rpc", "h:1"], None),  # row 3
        (["-c", "1"], {"localPath": {"path": "/models/a.gguf\n[x]\nagent = true"}}),  # row 5
    ],
)
async def test_the_apiserver_refuses_the_issue_16_presets(
    kmock: Any, args: list[str], source: dict[str, Any] | None
) -> None:
    """Issue 16 rows 1–3 and 5 through the emulator, which applies the CRD's schema and CEL
    rules as the apiserver would: refused at the door, with the reason."""
    await prepare(kmock, {})
    bad = preset("bad", args=args, **({"source": source} if source else {}))
    async with kmock.request("POST", MP_PATH, json=bad) as resp:
        text = await resp.text()
    assert resp.status == 422, text
    assert "args may only set" in text or "does not match" in text


async def test_the_apiserver_refuses_env_off_the_allow_list(kmock: Any) -> None:
    await prepare(kmock, {})
    bad = preset("bad", env={"LD_PRELOAD": "/tmp/x.so"})
    async with kmock.request("POST", MP_PATH, json=bad) as resp:
        text = await resp.text()
    assert resp.status == 422, text
    assert "env may only set device and memory variables" in text


async def test_missing_configmap_is_created(kmock: Any, cluster: tuple[Any, FakeAgents]) -> None:
    await send(kmock, "DELETE", f"/api/v1/namespaces/{NS}/configmaps/{CM}")
    await send(kmock, "POST", MP_PATH, preset("solo", placement={"nodeSelector": {"gpu": "a100"}}))

    async def check() -> None:
        models, _ = await configmap(kmock)
        assert models == {"gpu-1": "solo", "gpu-2": "solo"}

    await eventually(check)


def foreign_service(name: str) -> dict[str, Any]:
    """A Service the operator did not create (the chart's, a user's)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "theirs"}},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 9000, "targetPort": 9000}]},
    }


async def test_a_foreign_service_is_never_adopted(
    kmock: Any, cluster: tuple[Any, FakeAgents]
) -> None:
    await send(kmock, "POST", f"/api/v1/namespaces/{NS}/services", foreign_service("taken"))
    before = await get(kmock, f"/api/v1/namespaces/{NS}/services/taken")
    await send(kmock, "POST", MP_PATH, preset("taken"))

    async def check() -> None:
        st = await status(kmock, "taken")
        assert cond(st, "Degraded") == ("True", "ServiceConflict")
        assert "Service corral/taken exists and was not created by the corral operator" in (
            cond_message(st, "Degraded")
        )
        # The model itself is served: the conflict is about its Service only.
        assert cond(st, "Ready") == ("True", "AllNodesReady")
        assert "ServiceConflict" in await event_reasons(kmock, "taken")

    await eventually(check)
    assert await get(kmock, f"/api/v1/namespaces/{NS}/services/taken") == before

    # Once the name is free, the preset gets its own Service and the condition clears.
    await send(kmock, "DELETE", f"/api/v1/namespaces/{NS}/services/taken")

    async def recovered() -> None:
        svc = await get(kmock, f"/api/v1/namespaces/{NS}/services/taken")
        assert svc is not None and svc["metadata"]["ownerReferences"][0]["name"] == "taken"
        assert cond(await status(kmock, "taken"), "Degraded") == ("False", "AsExpected")

    await eventually(recovered)


def granted_by_the_chart() -> set[Access]:
    """The operator's permissions as the chart renders them, in the test's namespace."""
    return granted_to("-operator")


def test_row_18_configmap_writes_are_limited_to_the_presets_configmap() -> None:
    """Issue 16 row 18: the operator may patch its own ConfigMap, not every one in the
    namespace (create cannot be limited by name; pods and Services are named at run time)."""
    grants = granted_by_the_chart()
    patch = [g for g in grants if (g.resource, g.verb) == ("configmaps", "patch")]
    assert patch == [Access("", "configmaps", "patch", NS, CM)]


def covers(grant: Access, used: Access) -> bool:
    same = (grant.group, grant.resource, grant.verb) == (used.group, used.resource, used.verb)
    # A ClusterRole grants in every namespace; a Role only in its own; resourceNames only
    # those objects.
    return (
        same
        and (grant.namespace is None or grant.namespace == used.namespace)
        and (grant.name is None or grant.name == used.name)
    )


async def test_requests_match_the_rendered_rbac(
    kmock: Any, cluster: tuple[Any, FakeAgents]
) -> None:
    # Every kind of write the operator makes: create the missing ConfigMap, patch it, label
    # pods, create / repair / delete Services, write status, post Events, meet a 409.
    await send(kmock, "DELETE", f"/api/v1/namespaces/{NS}/configmaps/{CM}")
    await send(kmock, "POST", f"/api/v1/namespaces/{NS}/services", foreign_service("taken"))
    await send(kmock, "POST", MP_PATH, preset("taken"))
    await send(kmock, "POST", MP_PATH, preset("mine", placement={"nodeSelector": {"gpu": "a100"}}))

    async def served() -> None:
        models, _ = await configmap(kmock)
        assert models["gpu-1"] == "mine,taken"
        assert cond(await status(kmock, "mine"), "Ready") == ("True", "AllNodesReady")

    await eventually(served)
    # Someone edits our Service: the operator puts its ports back.
    await send(kmock, "PATCH", f"/api/v1/namespaces/{NS}/services/mine", {"spec": {"ports": []}})

    async def repaired() -> None:
        svc = await get(kmock, f"/api/v1/namespaces/{NS}/services/mine")
        assert svc is not None and svc["spec"]["ports"][0]["targetPort"] == 8080

    await eventually(repaired)
    await send(kmock, "DELETE", f"{MP_PATH}/mine")

    async def gone() -> None:
        assert await get(kmock, f"/api/v1/namespaces/{NS}/services/mine") is None

    await eventually(gone)
    used = set(kmock.operator_access)
    granted = granted_by_the_chart()
    assert sorted(u for u in used if not any(covers(g, u) for g in granted)) == []
    unused = sorted(g for g in granted if not any(covers(g, u) for u in used))
    assert unused == [], "\n".join(map(str, unused))


async def test_the_liveness_probe_answers(cluster: tuple[Any, FakeAgents]) -> None:
    _, agents = cluster

    async def alive() -> None:
        url = agents.operator_liveness
        try:
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                assert resp.status == 200, await resp.text()
        except aiohttp.ClientConnectionError as exc:  # kopf is not listening yet
            raise AssertionError(str(exc)) from exc

    await eventually(alive)


def test_only_a_status_naming_the_preset_says_it_is_gone() -> None:
    """A status write answered 404 for the preset itself drops it at once (its deletion fell
    in a watch gap); a 404 for a path the apiserver does not serve (a CRD without the status
    subresource) must not drop every preset."""
    from preset_operator.kube import KubeError

    gone = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
        '"modelpresets.corral.dev \\"gap\\" not found","reason":"NotFound","details":'
        '{"name":"gap","group":"corral.dev","kind":"modelpresets"},"code":404}'
    )
    assert KubeError(404, gone).object_missing("gap")
    assert not KubeError(404, gone).object_missing("other")
    unserved = '{"kind":"Status","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}'  # noqa: E501
    assert not KubeError(404, unserved).object_missing("gap")
    assert not KubeError(404, "404 page not found").object_missing("gap")
    assert not KubeError(409, gone).object_missing("gap")
