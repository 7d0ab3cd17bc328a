"""The chart, installed by the real helm into the real apiserver: admission (Pod Security
``restricted``), the scheduler placing the agents on kwok's GPU nodes, the CRD's schema and CEL
rules as the apiserver itself checks them, and every example of the repository applied."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.rendering import CHART, IMAGES
from tests.cluster.control_plane import REPO, CommandFailed, ControlPlane, wait_until
from tests.cluster.release import RESTRICTED, Release, gpu_nodes, install, namespace

# A control plane, a helm install and real processes: more than the default 120 s on a busy
# machine (the session's fixtures run in its first test).
pytestmark = pytest.mark.timeout(300)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_default_install_is_admitted_in_a_restricted_namespace(release: Release) -> None:
    cp = release.cp
    nodes = gpu_nodes(cp)
    assert nodes, "hack/k8s-env.sh made no GPU nodes"

    def every_pod_placed() -> None:
        refused = release.pod_security_refusals()
        assert not refused, refused
        daemonsets = cp.get("daemonsets", "-n", release.namespace)["items"]
        assert len(daemonsets) == 1
        st = daemonsets[0].get("status", {})
        assert st.get("desiredNumberScheduled") == len(nodes), st
        assert st.get("numberReady") == len(nodes), st
        deployment = cp.get("deployment", "-n", release.namespace, f"{release.fullname}-operator")
        assert deployment.get("status", {}).get("readyReplicas") == 1, deployment.get("status")

    # The refusals are events of the DaemonSet controller: wait long enough for it to try.
    wait_until(every_pod_placed, within=90)
    placed = sorted(p["spec"]["nodeName"] for p in release.agent_pods())
    assert placed == nodes
    for pod in release.agent_pods():
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1


def test_every_example_is_accepted(release: Release) -> None:
    cp = release.cp
    assert EXAMPLES
    names = []
    for path in EXAMPLES:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        names += [d["metadata"]["name"] for d in docs if d.get("kind") == "ModelPreset"]
        cp.kubectl("apply", "-f", str(path))
    try:
        listed = {o["metadata"]["name"] for o in cp.get("modelpresets")["items"]}
        assert set(names) <= listed
    finally:
        for path in EXAMPLES:
            cp.kubectl("delete", "-f", str(path), "--wait=false")


def preset(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {"name": name},
        "spec": {"source": {"localPath": {"path": "/models/x.gguf"}}, **spec},
    }


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            preset(
                "two",
                source={
                    "localPath": {"path": "/a"},
                    "url": {"url": "http://h/x", "sha256": "a" * 64},
                },
            ),
            "exactly one of source.huggingFace, source.url, source.localPath, source.pvc",
        ),
        (preset("qwen2.5"), "metadata.name must be a DNS-1035 label"),
        (preset("alias", aliases=["alias"]), "spec.aliases may not contain the model name itself"),
        (
            preset("pin", source={"huggingFace": {"repo": "org/repo", "revision": "main"}}),
            "source.huggingFace.revision needs source.huggingFace.file",
        ),
    ],
    ids=["two-sources", "dotted-name", "alias-of-itself", "revision-without-file"],
)
def test_the_apiserver_enforces_the_crds_rules(
    release: Release, obj: dict[str, Any], message: str
) -> None:
    code, out = release.cp.kubectl_result(
        "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(obj)
    )
    assert code != 0 and message in out, out


def test_the_model_name_is_immutable(release: Release) -> None:
    cp = release.cp
    cp.apply(preset("frozen", modelName="first"))
    try:
        code, out = cp.kubectl_result(
            "apply", "-f", "-", stdin=yaml.safe_dump(preset("frozen", modelName="second"))
        )
        assert code != 0 and "immutable" in out, out
    finally:
        cp.kubectl("delete", "modelpreset", "frozen", "--wait=false")


def test_a_valid_preset_passes_the_same_rules(release: Release) -> None:
    # The other side of the rules above: they do not refuse what they should let through.
    code, out = release.cp.kubectl_result(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=yaml.safe_dump(preset("fine", aliases=["other"])),
    )
    assert code == 0, out


def test_the_defaults_give_priority_a_key_and_a_network_policy(release: Release) -> None:
    cp, ns = release.cp, release.namespace
    # The Priority admission plugin resolved the chart's class into every agent pod.
    for pod in release.agent_pods():
        assert pod["spec"]["priorityClassName"] == f"{release.fullname}-agent"
        assert pod["spec"]["priority"] == 1000000
    secret = cp.get("secret", "-n", ns, f"{release.fullname}-api-key")
    assert len(base64.b64decode(secret["data"]["api-key"])) == 48
    policy = cp.get("networkpolicy", "-n", ns, f"{release.fullname}-agent")
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_an_upgrade_keeps_the_generated_key_and_certificate(
    release: Release, tmp_path: Path
) -> None:
    """A new key would lock every client out; a new CA would fail every client that trusts
    the old one (helm's lookup finds them in the real apiserver)."""
    cp, ns = release.cp, release.namespace
    names = (f"{release.fullname}-api-key", f"{release.fullname}-agent-tls")
    before = [cp.get("secret", "-n", ns, name)["data"] for name in names]
    assert set(before[1]) == {"tls.crt", "tls.key", "ca.crt"}
    values = tmp_path / "values.json"
    values.write_text(json.dumps(IMAGES))
    cp.helm("upgrade", release.name, str(CHART), "-n", ns, "-f", str(values))
    assert [cp.get("secret", "-n", ns, name)["data"] for name in names] == before


def test_agents_go_to_nodes_that_merely_have_a_label(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """GKE labels its GPU nodes cloud.google.com/gke-accelerator=<model>: an anyOfLabels entry
    of the key alone must schedule the agents there (the real scheduler decides)."""
    namespace(control_plane, "keyonly", RESTRICTED)
    other = install(
        control_plane,
        "keyonly",
        "keyonly",
        {
            "agent": {"gpu": {"anyOfLabels": ["nvidia.com/gpu.product"]}},
            "operator": {"enabled": False},
            "crds": {"enabled": False},
        },
        tmp_path,
    )
    try:
        placed = sorted(p["spec"]["nodeName"] for p in other.agent_pods())
        assert placed == gpu_nodes(control_plane)
    finally:
        control_plane.helm("uninstall", "keyonly", "-n", "keyonly", "--wait")


def test_a_second_operator_is_refused(release: Release, tmp_path: Path) -> None:
    """ModelPresets are cluster-scoped: two releases' operators would undo each other's work."""
    cp = release.cp
    namespace(cp, "second", RESTRICTED)
    with pytest.raises(CommandFailed) as refused:
        install(cp, "second", "second", {"crds": {"enabled": False}}, tmp_path, wait=False)
    assert f'release "{release.name}" already runs a Corral operator' in str(refused.value)
    assert "second" not in cp.helm("list", "-A", "-q").split()


def test_the_notes_say_when_nodes_have_more_gpus_than_an_agent_requests(release: Release) -> None:
    # kwok's GPU nodes have 8 each; the chart's default request is 1 (an agent sees only that).
    notes = release.cp.helm("get", "notes", release.name, "-n", release.namespace)
    nodes = gpu_nodes(release.cp)
    assert f"WARNING: {len(nodes)} node(s) have more nvidia.com/gpu than the 1 each agent" in notes
    assert all(f"{n} (8)" in notes for n in nodes), notes
