"""Installing the chart with the real helm into the real apiserver, and reading back what the
controllers made of it (DaemonSet pods placed by the scheduler on kwok's GPU nodes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.chart.rendering import CHART, IMAGES
from tests.cluster.control_plane import ControlPlane, wait_until

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@dataclass(frozen=True)
class Release:
    cp: ControlPlane
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return self.name if "corral" in self.name else f"{self.name}-corral"

    @property
    def presets_configmap(self) -> str:
        return f"{self.fullname}-presets"

    @property
    def agent_server_name(self) -> str:
        """The name the agents' certificate is checked by (the chart's agentServerName)."""
        return f"{self.fullname}-agent.{self.namespace}.svc"

    def agent_pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cp.get(
            "pods",
            "-n",
            self.namespace,
            "-l",
            f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=agent",
        )["items"]
        return items

    def pod_security_refusals(self) -> list[str]:
        """The controllers' FailedCreate events that name Pod Security: the pods it refused."""
        events = self.cp.get("events", "-n", self.namespace)["items"]
        return [
            e["message"]
            for e in events
            if e.get("reason") == "FailedCreate" and "PodSecurity" in e.get("message", "")
        ]


def namespace(cp: ControlPlane, name: str, labels: dict[str, str]) -> None:
    cp.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )


def install(
    cp: ControlPlane,
    name: str,
    ns: str,
    values: dict[str, Any],
    workdir: Path,
    *,
    wait: bool = True,
) -> Release:
    """``helm install`` of the chart with the test images' names on top of ``values``; with
    ``wait``, helm's own wait (every pod Ready, the DaemonSet's pods on every GPU node)."""
    merged = json.loads(json.dumps(IMAGES))
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    values_file = workdir / f"{name}-values.json"
    values_file.write_text(json.dumps(merged))
    args = ["install", name, str(CHART), "-n", ns, "-f", str(values_file)]
    if wait:
        args += ["--wait", "--timeout", "180s"]
    cp.helm(*args)
    return Release(cp, name, ns)


def gpu_nodes(cp: ControlPlane) -> list[str]:
    nodes = cp.get("nodes", "-l", "nvidia.com/gpu.present=true")["items"]
    return sorted(n["metadata"]["name"] for n in nodes)


def wait_agents_running(release: Release, count: int, within: float = 120) -> list[dict[str, Any]]:
    def running() -> list[dict[str, Any]]:
        pods = [
            p
            for p in release.agent_pods()
            if p.get("status", {}).get("phase") == "Running"
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        ]
        assert len(pods) == count, [p["metadata"]["name"] for p in pods]
        return pods

    result: list[dict[str, Any]] = wait_until(running, within)
    return result
