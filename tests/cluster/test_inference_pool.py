"""The chart's InferencePool, routed by the real endpoint picker of the Gateway API Inference
Extension (built from its module by hack/k8s-env.sh): run with the chart's Deployment's
command line and only its ServiceAccount's token, it scrapes real agents' routing metrics on
the chart's port and sends each request to the agent where its model is loaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.control_plane import CommandFailed, ControlPlane, wait_until
from tests.cluster.node_agents import NodeAgent, NodeAgents, node_agents, secret_value
from tests.cluster.picker_process import Picker, picker_folder, picker_running
from tests.cluster.release import (
    RESTRICTED,
    Release,
    gpu_nodes,
    install,
    namespace,
    wait_agents_running,
)
from tests.integration.harness import missing_in_ci_fails

NAMESPACE = "corral-pool"
VALUES = {
    "agent": {"tls": {"enabled": False}},
    "inferencePool": {"enabled": True},
    "operator": {"enabled": False},
    "crds": {"enabled": False},
}
TINY, SMALL = "demo-tiny", "demo-small"


@pytest.fixture(scope="module")
def picker_built() -> Path:
    folder = picker_folder()
    if folder is None:
        missing_in_ci_fails("the endpoint picker is not built: hack/k8s-env.sh build")
    assert folder is not None
    return folder


def test_the_pool_needs_the_extensions_crds(control_plane: ControlPlane, tmp_path: Path) -> None:
    """Before the extension's CRDs are in the cluster (this module adds them after)."""
    assert "inferencepools" not in control_plane.kubectl("api-resources", "-o", "name")
    namespace(control_plane, "pool-early", RESTRICTED)
    with pytest.raises(CommandFailed) as refused:
        install(control_plane, "early", "pool-early", VALUES, tmp_path, wait=False)
    assert "the cluster has no inference.networking.k8s.io/v1/InferencePool" in str(refused.value)


@pytest.fixture(scope="module")
def pool(
    control_plane: ControlPlane, picker_built: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    crds = sorted((picker_built / "crds").glob("*.yaml"))
    control_plane.kubectl("apply", *(a for crd in crds for a in ("-f", str(crd))))
    control_plane.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/inferencepools.inference.networking.k8s.io",
    )
    namespace(control_plane, NAMESPACE, RESTRICTED)
    yield install(
        control_plane, "pool", NAMESPACE, VALUES, tmp_path_factory.mktemp("pool"), wait=False
    )
    control_plane.helm("uninstall", "pool", "-n", NAMESPACE, "--wait")


@pytest.fixture(scope="module")
def routed(
    pool: Release,
    picker_built: Path,
    demo_dir: Path,
    llama_server: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NodeAgents, Picker]]:
    pods = wait_agents_running(pool, len(gpu_nodes(pool.cp)))
    workdir = tmp_path_factory.mktemp("pool-agents")
    with (
        node_agents(pool.cp, pool, pods, workdir, llama_server) as agents,
        picker_running(pool.cp, pool, picker_built, workdir) as picker,
    ):
        for agent in agents.agents.values():  # the node's models folder (hot reload)
            for model in (TINY, SMALL):
                (workdir / agent.pod / "models" / f"{model}.gguf").symlink_to(
                    demo_dir / f"{model}.gguf"
                )
        yield agents, picker


def test_every_pod_of_the_pool_is_admitted_under_restricted(pool: Release) -> None:
    def picker_ready() -> None:
        pods = pool.cp.get(
            "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=endpoint-picker"
        )
        assert [p["status"].get("phase") for p in pods["items"]] == ["Running"]

    wait_until(picker_ready, 120)
    assert pool.pod_security_refusals() == []
    (pool_object,) = pool.cp.get("inferencepools", "-n", NAMESPACE)["items"]
    assert pool_object["spec"]["endpointPickerRef"]["name"] == "pool-corral-picker"


def _key(release: Release) -> dict[str, str]:
    key = secret_value(release.cp, NAMESPACE, f"{release.fullname}-api-key", "api-key")
    return {"Authorization": f"Bearer {key}"}


def _load(agent: NodeAgent, model: str, key: dict[str, str]) -> None:
    def listed() -> None:
        status, body = agent.http("GET", "/models", headers=key)
        assert status == 200 and model in {m["id"] for m in body["data"]}, body

    def loaded() -> None:
        status, body = agent.http("GET", "/models", headers=key)
        assert status == 200, body
        (entry,) = [m for m in body["data"] if m["id"] == model]
        assert entry["status"]["value"] == "loaded", entry["status"]

    wait_until(listed, 30)
    status, body = agent.http("POST", "/models/load", {"model": model}, headers=key)
    assert status == 200, body
    wait_until(loaded, 60)


def test_the_picker_sends_a_request_to_the_agent_where_its_model_is_loaded(
    routed: tuple[NodeAgents, Picker],
) -> None:
    agents, picker = routed
    key = _key(agents.release)
    first, second = sorted(agents.agents.values(), key=lambda a: a.pod)
    _load(first, TINY, key)
    _load(second, SMALL, key)

    def goes_to(model: str, agent: NodeAgent) -> None:
        """Once the picker has scraped the change, every pick for ``model`` goes to ``agent``:
        twenty in a row (a picker choosing between the two by chance: 1 time in 2**20)."""
        where = f"{agent.ip}:{agent.port}"

        def picked() -> None:
            assert picker.pick(model) == where

        wait_until(picked, 30)
        chosen = [picker.pick(model) for _ in range(20)]
        assert set(chosen) == {where}, (model, chosen)

    goes_to(TINY, first)
    goes_to(SMALL, second)
    # The first agent unloads its only model (it then runs nothing) and the second loads it:
    # the picker follows, and never keeps what an agent ran before.
    status, body = first.http("POST", "/models/unload", {"model": TINY}, headers=key)
    assert status == 200, body
    _load(second, TINY, key)
    goes_to(TINY, second)


def test_the_network_policy_opens_the_routing_metrics_port_to_the_picker_alone(
    pool: Release,
) -> None:
    """It needs no credentials: the NetworkPolicy the apiserver holds admits the picker's pods
    to it, no one else, and selects the picker's pod (enforcing it is the network plugin's
    work; the cluster tier has none)."""
    policy = pool.cp.get("networkpolicy", "-n", NAMESPACE, "pool-corral-agent")
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["spec"]["ingress"]}
    assert by_port["routing-metrics"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "corral",
                    "app.kubernetes.io/instance": "pool",
                    "app.kubernetes.io/component": "endpoint-picker",
                }
            }
        }
    ]
    (pod,) = pool.cp.get(
        "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=endpoint-picker"
    )["items"]
    assert (
        pod["metadata"]["labels"].items()
        >= by_port["routing-metrics"][0]["podSelector"]["matchLabels"].items()
    )
