"""The operator against real agents: ``corral agent`` processes on loopback, one per fake node,
each reading the presets ConfigMap the operator writes through a kubelet-style ``..data``
volume, with real llama-server children and the API key on.

Only the apiserver is emulated (kmock, held to the apiserver's rules); the kubelet's part is a
task that copies the ConfigMap into each node's volume as the kubelet does. This is where the
status contract (the agent's ``GET /models`` → ``ModelPreset.status``) and runtime loading are
exercised end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from preset_operator.agents import AgentPod

from node_agent.models_schema import ModelList, dump
from tests.integration.harness import AgentProcess, http
from tests.kubelet import write_configmap_volume
from tests.operator.agent_models import model_entry
from tests.operator.apiserver import StrictEmulator
from tests.operator.cluster import (
    API_KEY,
    CM,
    MP_PATH,
    NS,
    cond,
    cond_message,
    eventually,
    get,
    node,
    operator_running,
    prepare,
    send,
    status,
)
from tests.operator.presets import preset

pytestmark = pytest.mark.kmock(cls=StrictEmulator)

NODES = {"agent-a": "node-a", "agent-b": "node-b"}  # agent pod → node
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class RealAgents:
    agents: dict[str, AgentProcess]  # by pod name

    def url(self, pod: AgentPod) -> str | None:
        agent = self.agents.get(pod.name)
        return agent.url if agent is not None else None

    def models(self, pod: str) -> dict[str, Any]:
        code, body = http("GET", self.agents[pod].url + "/models", headers=AUTH)
        assert code == 200, body
        return {m["id"]: m for m in body["data"]}


async def kubelet(kmock: Any, volumes: dict[str, Path]) -> None:
    """Sync the presets ConfigMap into every node's volume whenever its data changes."""
    seen: dict[str, str] | None = None
    version = 0
    while True:
        body = await get(kmock, f"/api/v1/namespaces/{NS}/configmaps/{CM}")
        data = dict((body or {}).get("data") or {})
        if data != seen:
            version += 1
            for volume in volumes.values():
                write_configmap_volume(volume, data, f"v{version}")
            seen = data
        await asyncio.sleep(0.2)


@pytest.fixture
def broken_model(tmp_path: Path) -> Path:
    """A file named like a model that is not a GGUF: its llama-server child fails to load."""
    path = tmp_path / "broken" / "broken.gguf"
    path.parent.mkdir()
    path.write_bytes(b"not a gguf file at all\n" * 64)
    return path


@pytest.fixture
def started_agents(
    tmp_path: Path, llama_server: str
) -> Iterator[tuple[RealAgents, dict[str, Path]]]:
    volumes: dict[str, Path] = {}
    agents: dict[str, AgentProcess] = {}
    empty = tmp_path / "models-dir"
    empty.mkdir()
    try:
        for pod_name, node_name in NODES.items():
            volume = tmp_path / f"presets-{node_name}"
            volume.mkdir()
            # The chart's ConfigMap starts without data: the kubelet mounts an empty volume.
            write_configmap_volume(volume, {}, "v0")
            volumes[node_name] = volume
            agents[pod_name] = AgentProcess(
                [
                    "--models-dir", str(empty),
                    "--models-preset", str(volume),
                    "--memory-limit", "host=8GiB",
                    "--llama-server", llama_server,
                    "-c", "512",
                ],
                env={"NODE_NAME": node_name, "LLAMA_API_KEY": API_KEY},
            )  # fmt: skip
        yield RealAgents(agents), volumes
    finally:
        for agent in agents.values():
            agent.stop()


@pytest.fixture
async def cluster(
    kmock: Any, started_agents: tuple[RealAgents, dict[str, Path]]
) -> AsyncIterator[tuple[Any, RealAgents]]:
    agents, volumes = started_agents
    for name in NODES.values():
        await send(kmock, "POST", "/api/v1/nodes", node(name, pool="test"))
    await prepare(kmock, NODES)
    sync = asyncio.create_task(kubelet(kmock, volumes))
    try:
        async with operator_running(kmock, agents.url, poll_interval=0.3):
            yield kmock, agents
    finally:
        sync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sync
    assert kmock.refused == []


def test_the_fake_agents_serve_the_real_agents_keys(
    started_agents: tuple[RealAgents, dict[str, Path]], demo_dir: Path, tmp_path: Path
) -> None:
    # What the kmock tier's fake agents serve (tests/operator/agent_models.py) has exactly the
    # keys a real agent sends, at every level, for a loaded and for a failed model.
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "tiny.gguf").symlink_to(demo_dir / "demo-tiny.gguf")
    (folder / "broken.gguf").write_bytes(b"not a gguf\n" * 64)
    # As the operator's agents have them: from preset sections (so with their hashes).
    ini = tmp_path / "presets.ini"
    ini.write_text("".join(f"[{m}]\nmodel = {folder / m}.gguf\n" for m in ("tiny", "broken")))
    agent = AgentProcess(["--models-preset", str(ini), "--memory-limit", "host=8GiB"])
    try:
        assert agent.post("/models/load", {"model": "tiny"})[0] == 200
        agent.wait_state("tiny", "loaded")
        agent.post("/models/load", {"model": "broken"})
        deadline = time.monotonic() + 30
        while not agent.models()["broken"]["status"].get("failed"):
            assert time.monotonic() < deadline, agent.models()["broken"]
            time.sleep(0.05)
        real = agent.models()
    finally:
        agent.stop()

    # Maps keyed by device or by llama-server's own names, whose keys are data, not schema.
    opaque = {
        "meta",
        "architecture",
        *(f"corral.memory.{k}" for k in ("min", "max", "effective", "held")),
    }

    def keys(value: Any, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, inner in value.items():
            out.add(prefix + key)
            if isinstance(inner, dict) and prefix + key not in opaque:
                out |= keys(inner, f"{prefix}{key}.")
        return out

    fake_loaded = model_entry("tiny", memory={"host": 1}, preset_hash="0123456789ab")
    fake_failed = model_entry(
        "broken", "unloaded", exit_code=1, error="x", memory={"host": 1}, preset_hash="x"
    )
    assert keys(fake_loaded) == keys(real["tiny"]) - {"meta"}
    assert keys(fake_failed) == keys(real["broken"])
    # And the real answer round-trips through the schema unchanged: nothing is unmodelled.
    for entry in real.values():
        assert dump(ModelList.model_validate({"object": "list", "data": [entry]}))["data"] == [
            entry
        ]


async def test_presets_applied_after_the_agents_started(
    cluster: tuple[Any, RealAgents], demo_dir: Path, broken_model: Path
) -> None:
    kmock, agents = cluster
    await send(
        kmock,
        "POST",
        MP_PATH,
        preset(
            "tiny",
            source={"localPath": {"path": str(demo_dir / "demo-tiny.gguf")}},
            lifecycle={"loadOnStartup": True},
        ),
    )

    async def ready() -> dict[str, Any]:
        st = await status(kmock, "tiny")
        assert cond(st, "Ready") == ("True", "AllNodesReady"), st.get("conditions")
        assert [n["name"] for n in st["nodes"]] == ["node-a", "node-b"]
        for entry in st["nodes"]:
            assert entry["state"] == "Loaded"
            # The agent's ledger figures, as it reports them under corral.memory.
            assert entry["memory"]["effective"]["host"] > 0
            assert entry["memory"]["min"]["host"] > 0
        return st

    st = await eventually(ready, within=60)
    real = await asyncio.to_thread(agents.models, "agent-a")
    assert st["nodes"][0]["memory"] == real["tiny"]["corral"]["memory"]

    # A broken model: the node's child fails, the preset is Degraded with the child's own line.
    await send(
        kmock,
        "POST",
        MP_PATH,
        preset(
            "broken",
            source={"localPath": {"path": str(broken_model)}},
            placement={"nodeSelector": {"pool": "test"}},
            lifecycle={"loadOnStartup": True},
        ),
    )

    async def degraded() -> dict[str, Any]:
        st = await status(kmock, "broken")
        assert cond(st, "Degraded") == ("True", "NodesFailed"), st.get("conditions")
        assert {n["state"] for n in st["nodes"]} == {"Failed"}
        return st

    st = await eventually(degraded, within=60)
    real = await asyncio.to_thread(agents.models, "agent-a")
    line = real["broken"]["corral"]["error"]
    assert line and "llama-server exited with code" not in line
    assert st["nodes"][0]["lastError"] == line
    assert line in cond_message(st, "Degraded")
    # The good preset is untouched by its neighbour's failure.
    assert cond(await status(kmock, "tiny"), "Ready") == ("True", "AllNodesReady")
