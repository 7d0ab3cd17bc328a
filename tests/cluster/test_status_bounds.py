"""ModelPreset.status as the real apiserver validates it on every PATCH of the status
subresource: within the CRD's bounds however many nodes a preset matches, and no per-node
heartbeat rewritten into it (what Kubernetes moved to Lease objects for Nodes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.control_plane import ControlPlane, wait_until
from tests.cluster.world import World, preset

# A control plane, a helm install and real processes: more than the default 120 s on a busy
# machine (the session's fixtures run in its first test).
pytestmark = pytest.mark.timeout(300)

POOL = {"corral.test/pool": "wide"}
# Long node names (DNS subdomains may be 253 characters): 180 of them make a list of names
# longer than the CRD's 32768-character condition message.
NODES = 180


def node_name(i: int) -> str:
    return f"wide-{i:03d}." + ".".join(["n" * 60] * 3)


def wide_nodes() -> list[dict[str, Any]]:
    """GPU nodes as hack/k8s-env.sh makes them, with long names: the chart's DaemonSet puts an
    agent pod on each, and no agent answers there (the operator sees them Unknown)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name(i),
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    **POOL,
                    "kubernetes.io/hostname": f"wide-{i:03d}",
                    "type": "kwok",
                    "nvidia.com/gpu.present": "true",
                },
            },
            "spec": {
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
            },
            "status": {
                "capacity": {"cpu": "8", "memory": "64Gi", "pods": "10", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "10", "nvidia.com/gpu": "8"},
            },
        }
        for i in range(NODES)
    ]


@pytest.fixture
def wide_pool(world: World) -> Iterator[None]:
    cp: ControlPlane = world.cp
    cp.apply(wide_nodes())
    try:
        yield
    finally:
        # The DaemonSet's pods there go with the nodes (the pod garbage collector).
        cp.kubectl("delete", "nodes", "-l", "corral.test/pool=wide", "--wait=false")


def test_status_of_a_preset_on_many_unreachable_nodes_is_written_and_bounded(
    world: World, wide_pool: None
) -> None:
    world.cp.apply(
        preset("wide", world.models / "demo-tiny.gguf", placement={"nodeSelector": POOL})
    )
    try:

        def written() -> dict[str, Any]:
            st = world.status("wide")
            # Before any agent answers, all 180 nodes are Unknown: that status must be accepted.
            assert st.get("matchedNodes") == NODES, {k: v for k, v in st.items() if k != "nodes"}
            return st

        st = wait_until(written, within=90)
        for cond in st["conditions"]:
            assert len(cond["message"]) <= 4096, (cond["type"], len(cond["message"]))
        ready = world.condition("wide", "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "AgentsUnknown")
        assert f"{NODES}" in ready["message"], ready["message"][:300]
        # Counts for all, details for a few; no heartbeat per node.
        assert {k: v for k, v in st["nodeCounts"].items() if v} == {"Unknown": NODES}
        assert len(st["nodes"]) <= 32
        assert all("lastSeen" not in n for n in st["nodes"])
        assert len(json.dumps(st)) < 32 * 1024
    finally:
        world.cp.kubectl("delete", "modelpreset", "wide", "--wait=false")
