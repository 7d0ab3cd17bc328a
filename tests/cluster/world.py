"""The operator and real agents on the real control plane, once for the session: the chart's
DaemonSet pods (placed on kwok's GPU nodes) each backed by a real ``corral agent`` on the pod's
IP, and ``corral operator`` with the chart's command line and its ServiceAccount's token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.control_plane import ControlPlane
from tests.cluster.node_agents import NodeAgents, admin_get, node_agents
from tests.cluster.operator_process import OperatorProcess, operator_running
from tests.cluster.release import Release, gpu_nodes, wait_agents_running

MP = "/apis/corral.dev/v1alpha1/modelpresets"


def preset(name: str, path: Path, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {"name": name},
        "spec": {"source": {"localPath": {"path": str(path)}}, **spec},
    }


class World:
    def __init__(
        self, release: Release, agents: NodeAgents, operator: OperatorProcess, models: Path
    ) -> None:
        self.release = release
        self.cp: ControlPlane = release.cp
        self.agents = agents
        self.operator = operator
        self.models = models

    def status(self, name: str) -> dict[str, Any]:
        body = admin_get(self.cp, f"{MP}/{name}")
        assert body is not None, f"no ModelPreset {name}"
        return dict(body.get("status") or {})

    def condition(self, name: str, ctype: str) -> dict[str, Any]:
        found = [c for c in self.status(name).get("conditions", []) if c["type"] == ctype]
        assert found, f"no {ctype} condition on {name} yet"
        return dict(found[0])

    def configmap_models(self) -> set[str]:
        ns, cm = self.release.namespace, self.release.presets_configmap
        data = (admin_get(self.cp, f"/api/v1/namespaces/{ns}/configmaps/{cm}") or {}).get(
            "data"
        ) or {}
        return {
            m
            for key, text in data.items()
            if key.endswith(".ini")
            for m in re.findall(r"^\[(.+)\]$", text, re.M)
        }

    def service(self, name: str) -> dict[str, Any] | None:
        return admin_get(self.cp, f"/api/v1/namespaces/{self.release.namespace}/services/{name}")


def start_world(
    release: Release,
    demo_dir: Path,
    llama_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    pods = wait_agents_running(release, len(gpu_nodes(release.cp)))
    workdir = tmp_path_factory.mktemp("cluster-agents")
    # Short intervals for a test's patience; the code paths are the production ones.
    with (
        node_agents(release.cp, release, pods, workdir, llama_server) as agents,
        operator_running(
            release.cp,
            release,
            workdir,
            ["--poll-interval", "1"],
            env={"CORRAL_RELIST_INTERVAL": "2"},
        ) as operator,
    ):
        yield World(release, agents, operator, demo_dir)
