"""The reconciler's writers against a recording API (the ``Cluster`` seam): what is written,
and what is deliberately not."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import aiohttp
from preset_operator.agents import AgentPod
from preset_operator.presets import parse_preset
from preset_operator.reconcile import Config, Indexes, Reconciler
from preset_operator.render import CONFIGMAP_LIMIT, Rendering
from preset_operator.status import AgentReport, ModelReport

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
MODEL_M = {
    "metadata": {"name": "m", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"source": {"localPath": {"path": "/models/m.gguf"}}},
}


class RecordingCluster:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", path, body))
        return dict(body)

    async def patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", path, body))
        return dict(body)

    async def delete(self, path: str) -> None:
        self.calls.append(("delete", path, None))


def reconciler(**stores: dict[str, list[Any]]) -> tuple[Reconciler, RecordingCluster]:
    cluster = RecordingCluster()
    session: Any = aiohttp.ClientSession  # never used by the writers under test
    rec = Reconciler(Config(namespace="corral"), cluster, session, lambda pod: None)
    empty: dict[str, list[Any]] = {}
    rec.attach(
        Indexes(
            presets=stores.get("presets", empty),
            nodes=stores.get("nodes", empty),
            agents=stores.get("agents", empty),
            services=stores.get("services", empty),
            configmaps=stores.get("configmaps", {"corral-presets": [{}]}),
        )
    )
    return rec, cluster


def rendering(files: dict[str, str], node_sets: dict[str, tuple[str, ...]]) -> Rendering:
    return Rendering(files=files, node_sets=node_sets, matched={}, conflicts={}, invalid={})


async def test_an_oversized_configmap_is_not_written_and_every_preset_says_why() -> None:
    rec, cluster = reconciler()
    big = {f"preset-{i:012x}.ini": "x" * 200_000 for i in range(6)}  # 1.2 MB of values
    await rec._write_configmap(rendering(big, {"n1": tuple(big)}))
    assert cluster.calls == []
    assert rec.configmap_problem is not None
    assert f"over the {CONFIGMAP_LIMIT}-byte limit" in rec.configmap_problem
    assert "1 nodes, 6 presets" in rec.configmap_problem
    # Back under the limit: written, and the problem clears.
    small = {"preset-000000000001.ini": "[m]\n"}
    await rec._write_configmap(rendering(small, {"n1": tuple(small)}))
    assert [c[0] for c in cluster.calls] == ["patch"] and rec.configmap_problem is None


async def test_a_fresh_operator_whose_first_poll_failed_keeps_the_pods_labels() -> None:
    pod = AgentPod("agent-a", "n1", "10.0.0.1", {"preset.corral.dev/m": "true"})
    rec, cluster = reconciler(agents={"agent-a": [pod]})
    rec.reports = {"n1": AgentReport(last_seen=None, error="agent unreachable: timeout")}
    files = {"preset-000000000001.ini": "[m]\n"}
    offered = Rendering(
        files=files,
        node_sets={"n1": tuple(files)},
        matched={"m": ("n1",)},
        conflicts={},
        invalid={},
        presets={"m": parse_preset(MODEL_M)},
    )
    await rec._write_pod_labels([pod], offered)
    assert cluster.calls == []
    # Once the agent answered and no longer lists the model, the label goes.
    rec.reports = {"n1": AgentReport(last_seen=NOW, models={"other": ModelReport("loaded")})}
    await rec._write_pod_labels([pod], offered)
    assert cluster.calls == [
        (
            "patch",
            "/api/v1/namespaces/corral/pods/agent-a",
            {"metadata": {"labels": {"preset.corral.dev/m": None}}},
        )
    ]
