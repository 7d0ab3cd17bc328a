"""What the rendered objects promise: the contract with the agent and the operator, security,
scheduling on GPU nodes, and least-privilege RBAC."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import helm_python
import pytest
import yaml
from preset_operator.presets import PVC_MOUNT_ROOT, PvcSource, parse_source

from node_agent.core.endpoint_slices import PORT_NAME
from node_agent.sources.options import llama_options
from tests.chart.rendering import (
    CHART,
    FULLNAME,
    IMAGES,
    NAMESPACE,
    RELEASE,
    REPO,
    Manifest,
    Rendered,
    pod_specs,
    render_objects,
    render_templates,
    scenario_values,
    with_images,
)

Render = Callable[..., Rendered]

STABLE_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
}
AGENT_SELECTOR = {
    "app.kubernetes.io/name": "corral",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "agent",
}
# The agent's default per-model stop-timeout (SPEC: preset key stop-timeout, default 10 s).
AGENT_STOP_TIMEOUT_S = 10
CPU_ONLY = CHART / "ci" / "cpu-only-values.yaml"
API_KEY = CHART / "ci" / "api-key-values.yaml"
PVC_CACHE = CHART / "ci" / "pvc-cache-values.yaml"


def agent_pod(rendered: Rendered) -> Manifest:
    spec: Manifest = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    return spec


def agent_container(rendered: Rendered) -> Manifest:
    (container,) = agent_pod(rendered)["containers"]
    assert container["name"] == "agent"
    result: Manifest = container
    return result


def operator_container(rendered: Rendered) -> Manifest:
    (container,) = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"]
    result: Manifest = container
    return result


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


# --- Security ------------------------------------------------------------------------------


def test_every_pod_runs_restricted(scenario: Path) -> None:
    rendered = Rendered(render_objects(scenario_values(scenario)))
    owners = []
    for owner, spec in pod_specs(rendered):
        owners.append(owner)
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, owner
        assert pod_sc["runAsUser"] != 0, owner
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, owner
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), owner
        # Pod Security's baseline and restricted levels refuse a hostPath volume outright.
        assert not [v for v in spec.get("volumes", []) if "hostPath" in v], owner
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, owner
            assert sc["allowPrivilegeEscalation"] is False, owner
            assert sc["capabilities"] == {"drop": ["ALL"]}, owner
            assert not sc.get("privileged"), owner
    assert any(o.startswith("DaemonSet/") for o in owners)


def test_writable_tmp_is_an_empty_dir(render: Render) -> None:
    rendered = render()
    for owner, spec in pod_specs(rendered):
        if owner.startswith("Pod/"):
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        (container,) = spec["containers"]
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1, owner
        assert "emptyDir" in volumes[tmp[0]["name"]], owner


def test_warm_caches_fit_in_the_writable_tmp(render: Render) -> None:
    # The agent's $HOME is /tmp (an emptyDir with tmpSizeLimit): warm swaps' default 2 GiB
    # there would outgrow the chart's 1Gi and get the pod evicted.
    args = agent_container(render())["args"]
    assert args[args.index("--warm-cache-size") + 1] == "512MiB"
    args = agent_container(render({"agent": {"warmCacheSize": "0"}}))["args"]
    assert args[args.index("--warm-cache-size") + 1] == "0"


def test_agent_needs_no_kubernetes_api_token_without_peers(render: Render) -> None:
    rendered = render({"agent": {"peers": {"enabled": False}}})
    assert agent_pod(rendered)["automountServiceAccountToken"] is False
    sa = rendered.one("ServiceAccount", f"{FULLNAME}-agent")
    assert sa["automountServiceAccountToken"] is False
    container = agent_container(rendered)
    assert "--peers-from-service" not in container["args"]
    assert not {"POD_NAME", "POD_IP"} & {e["name"] for e in container["env"]}
    assert f"{FULLNAME}-agent-peers" not in {r["metadata"]["name"] for r in rendered.all("Role")}


def test_agents_find_their_peers_from_the_headless_service(render: Render) -> None:
    rendered = render()
    pod = agent_pod(rendered)
    # Only this pod mounts the token (the ServiceAccount keeps its own default).
    assert pod["automountServiceAccountToken"] is True
    container = agent_container(rendered)
    args = container["args"]
    service = args[args.index("--peers-from-service") + 1]
    assert service == f"{NAMESPACE}/{FULLNAME}-agent-headless"
    headless = rendered.one("Service", f"{FULLNAME}-agent-headless")
    assert headless["spec"]["clusterIP"] == "None"
    # The agent takes the port named http (core/endpoint_slices.py PORT_NAME).
    assert [p["name"] for p in headless["spec"]["ports"]] == [PORT_NAME]
    env = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for e in container["env"]
    }
    assert (env["POD_NAME"], env["POD_IP"]) == ("metadata.name", "status.podIP")


# --- The agent's contract ------------------------------------------------------------------


def test_agent_command_is_the_contract(render: Render) -> None:
    container = agent_container(render())
    assert container["command"] == ["corral"]
    assert container["args"][:11] == [
        "agent",
        "--host", "0.0.0.0",
        "--port", "8080",
        "--models-dir", "/models",
        "--models-preset", "/etc/corral/presets",
        "--models-max", "4",
    ]  # fmt: skip
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]


def test_agent_options_from_values(render: Render) -> None:
    args = agent_container(render(scenario_values(CPU_ONLY)))["args"]
    assert args[args.index("--models-max") + 1] == "2"
    assert args[args.index("--memory-limit") + 1] == "host=4GiB"
    args = agent_container(
        render({"agent": {"modelsMemoryMarginMiB": 512, "extraArgs": ["-c", "4096"]}})
    )["args"]
    assert args[args.index("--models-memory-margin") + 1] == "512"
    assert args[-2:] == ["-c", "4096"]


@pytest.mark.parametrize(
    ("values", "margin"),
    [
        ({}, "1024"),  # GPUs from the device plugin
        ({"agent": {"gpu": {"mode": "runtimeClass"}}}, "1024"),
        ({"agent": {"gpu": {"mode": "none"}}}, None),
        ({"agent": {"modelsMemoryMarginMiB": -1}}, None),
        ({"agent": {"modelsMemoryMarginMiB": 0}}, "0"),
    ],
)
def test_memory_ledger_is_on_whenever_the_agent_gets_gpus(
    render: Render, values: dict[str, Any], margin: str | None
) -> None:
    args = agent_container(render(values))["args"]
    found = args[args.index("--models-memory-margin") + 1] if margin is not None else None
    assert found == margin
    assert ("--models-memory-margin" in args) == (margin is not None)
    notes = render_templates(values)["corral/templates/NOTES.txt"]
    on = f"The memory ledger is on (--models-memory-margin {margin} MiB)"
    assert (on in notes) == (margin is not None)
    assert ("The memory ledger is off" in notes) == (margin is None)


def test_memory_limits_name_the_agents_devices(render: Render) -> None:
    args = agent_container(render({"agent": {"memoryLimits": {"CUDA0": "20GiB"}}}))["args"]
    assert args[args.index("--memory-limit") + 1] == "CUDA0=20GiB"
    with pytest.raises(helm_python.HelmValuesError, match="/agent/memoryLimits"):
        helm_python.Chart.load(CHART).validate_schema(
            with_images({"agent": {"memoryLimits": {"0": "20GiB"}}})
        )


def test_images_must_be_named(render: Render) -> None:
    # Nothing is published under a name the project owns: no default may point anywhere.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for part in ("agent", "operator"):
        assert values[part]["image"]["registry"] == values[part]["image"]["repository"] == ""
    with pytest.raises(helm_python.HelmValuesError) as refused:
        helm_python.Chart.load(CHART).validate_schema({})
    assert "/agent/image/repository" in str(refused.value)
    assert "/operator/image/repository" in str(refused.value)
    # Without the operator, its image is not needed.
    helm_python.Chart.load(CHART).validate_schema(
        {"operator": {"enabled": False}, "agent": IMAGES["agent"]}
    )
    rendered = render()
    assert agent_container(rendered)["image"] == (
        "registry.example.com/corral/corral-agent:0.1.0-cuda"
    )
    assert operator_container(rendered)["image"] == (
        "registry.example.com/corral/corral-operator:0.1.0"
    )
    mirrored = render({"global": {"imageRegistry": "mirror.example.com"}})
    assert agent_container(mirrored)["image"] == (
        "mirror.example.com/registry.example.com/corral/corral-agent:0.1.0-cuda"
    )
    chart = (CHART / "Chart.yaml").read_text()
    assert "corral-dev" not in chart and "corral-dev" not in (CHART / "values.yaml").read_text()


def test_downloads_go_to_their_own_cache(render: Render) -> None:
    rendered = render()
    container = agent_container(rendered)
    assert env_of(container)["LLAMA_CACHE"] == {"name": "LLAMA_CACHE", "value": "/var/cache/corral"}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/cache/corral"]
    volumes = {v["name"]: v for v in agent_pod(rendered)["volumes"]}
    # By default an emptyDir: what a restricted namespace admits (a hostPath is by choice).
    assert volumes[mount["name"]] == {"name": mount["name"], "emptyDir": {}}
    host = render({"agent": {"downloadCache": {"type": "hostPath"}}})
    volumes = {v["name"]: v for v in agent_pod(host)["volumes"]}
    assert volumes[mount["name"]]["hostPath"] == {
        "path": "/var/lib/corral/cache",
        "type": "DirectoryOrCreate",
    }
    pvc = render(
        {
            "agent": {
                "downloadCache": {
                    "type": "persistentVolumeClaim",
                    "persistentVolumeClaim": {"claimName": "model-downloads"},
                }
            }
        }
    )
    volumes = {v["name"]: v for v in agent_pod(pvc)["volumes"]}
    assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "model-downloads"}
    # Never the pod's small scratch /tmp, which is also $HOME.
    assert not mount["mountPath"].startswith("/tmp")


def test_hostpath_caches_are_given_to_the_agents_user(render: Render) -> None:
    # The kubelet creates a missing hostPath directory owned by root; uid 10001 could not write.
    assert "initContainers" not in agent_pod(render())
    pod = agent_pod(render({"agent": {"modelCache": {"type": "hostPath"}}}))
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", "10001:10001", "/models"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert [m["name"] for m in init["volumeMounts"]] == ["models"]
    both = {"modelCache": {"type": "hostPath"}, "downloadCache": {"type": "hostPath"}}
    (init,) = agent_pod(render({"agent": both}))["initContainers"]
    assert init["command"][2:] == ["/models", "/var/cache/corral"]
    off = {**both, "hostPathOwnership": {"enabled": False}}
    assert "initContainers" not in agent_pod(render({"agent": off}))


def test_node_name_comes_from_the_downward_api(render: Render) -> None:
    env = env_of(agent_container(render()))
    assert env["NODE_NAME"] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }


def test_api_key_is_on_by_default_from_a_generated_secret(render: Render) -> None:
    rendered = render()
    generated = {"secretKeyRef": {"name": f"{FULLNAME}-api-key", "key": "api-key"}}
    assert env_of(agent_container(rendered))["LLAMA_API_KEY"]["valueFrom"] == generated
    assert env_of(operator_container(rendered))["LLAMA_API_KEY"]["valueFrom"] == generated
    secret = rendered.one("Secret", f"{FULLNAME}-api-key")
    key = base64.b64decode(secret["data"]["api-key"]).decode()
    assert len(key) == 48 and key.isalnum()
    # Off only when asked.
    off = render({"agent": {"apiKey": {"enabled": False}}})
    assert "LLAMA_API_KEY" not in env_of(agent_container(off))
    assert "LLAMA_API_KEY" not in env_of(operator_container(off))
    assert [o["metadata"]["name"] for o in off.all("Secret")] == [f"{FULLNAME}-agent-tls"]


def test_api_key_comes_from_the_users_secret_when_named(render: Render) -> None:
    # LLAMA_API_KEY: the name llama-server and the agent read (node_agent's option table).
    assert llama_options().named("api-key").env == "LLAMA_API_KEY"
    rendered = render(scenario_values(API_KEY))
    secret_ref = {"secretKeyRef": {"name": "corral-api-key", "key": "api-key"}}
    assert env_of(agent_container(rendered))["LLAMA_API_KEY"]["valueFrom"] == secret_ref
    # The operator polls the agents with the same key.
    assert env_of(operator_container(rendered))["LLAMA_API_KEY"]["valueFrom"] == secret_ref
    (test_container,) = rendered.one("Pod")["spec"]["containers"]
    assert env_of(test_container)["LLAMA_API_KEY"]["valueFrom"] == secret_ref
    # helm test checks the key is required, not only accepted.
    assert "%{http_code}" in test_container["command"][-1]
    assert "!= 401" in test_container["command"][-1]
    generated = [o["metadata"]["name"] for o in rendered.all("Secret")]
    assert generated == [f"{FULLNAME}-agent-tls"], "the user's key: none generated"


def test_presets_configmap_is_mounted_as_a_directory(scenario: Path) -> None:
    rendered = Rendered(render_objects(scenario_values(scenario)))
    for ds in rendered.all("DaemonSet"):  # one per GPU pool
        pod = ds["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (container,) = pod["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "presets"]
        assert mount == {"name": "presets", "mountPath": "/etc/corral/presets", "readOnly": True}
        assert volumes["presets"]["configMap"] == {"name": f"{FULLNAME}-presets"}
    # No mount of any pod may use subPath: a subPath mount never sees ConfigMap updates.
    for owner, spec in pod_specs(rendered):
        for container in spec["containers"]:
            for m in container.get("volumeMounts", []):
                assert "subPath" not in m and "subPathExpr" not in m, (owner, m)


def test_presets_configmap_renders_no_data(render: Render) -> None:
    # The operator owns the data: a rendered placeholder would reset every node's presets on
    # each `helm upgrade` or Argo CD sync where `lookup` finds nothing (helm template).
    configmap = render().one("ConfigMap", f"{FULLNAME}-presets")
    assert "data" not in configmap and "binaryData" not in configmap
    assert "(lookup " not in (CHART / "templates" / "configmap.yaml").read_text()


@pytest.mark.parametrize(
    ("values", "volume"),
    [
        ({}, {"emptyDir": {}}),
        (
            {"agent": {"modelCache": {"type": "hostPath"}}},
            {"hostPath": {"path": "/var/lib/corral/models", "type": "DirectoryOrCreate"}},
        ),
        (
            {"agent": {"modelCache": {"type": "emptyDir", "emptyDir": {"sizeLimit": "20Gi"}}}},
            {"emptyDir": {"sizeLimit": "20Gi"}},
        ),
        (
            scenario_values(PVC_CACHE),
            {"persistentVolumeClaim": {"claimName": "corral-models", "readOnly": True}},
        ),
    ],
    ids=["default", "hostPath", "emptyDir", "pvc"],
)
def test_model_cache_is_mounted_at_models(
    render: Render, values: dict[str, Any], volume: Manifest
) -> None:
    rendered = render(values)
    volumes = {v["name"]: v for v in agent_pod(rendered)["volumes"]}
    assert volumes["models"] == {"name": "models", **volume}
    (mount,) = [m for m in agent_container(rendered)["volumeMounts"] if m["name"] == "models"]
    assert mount["mountPath"] == "/models"


def test_pvc_mounts_for_pvc_sources(render: Render) -> None:
    rendered = render(scenario_values(PVC_CACHE))
    volumes = {v["name"]: v for v in agent_pod(rendered)["volumes"]}
    mounts = {m["mountPath"]: m for m in agent_container(rendered)["volumeMounts"]}
    mount = mounts[f"{PVC_MOUNT_ROOT}/shared-models"]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["persistentVolumeClaim"] == {
        "claimName": "shared-models",
        "readOnly": True,
    }


def test_pvc_mounts_are_where_the_operator_points(render: Render) -> None:
    """The operator renders source.pvc to PVC_MOUNT_ROOT/<claimName>/<subPath>: every claim
    in agent.pvcMounts must be mounted at exactly PVC_MOUNT_ROOT/<claimName>."""
    claims = ["shared-models", "team.b-models"]
    rendered = render({"agent": {"pvcMounts": [{"claimName": c} for c in claims]}})
    volumes = {v["name"]: v for v in agent_pod(rendered)["volumes"]}
    by_claim = {
        volumes[m["name"]]["persistentVolumeClaim"]["claimName"]: m
        for m in agent_container(rendered)["volumeMounts"]
        if "persistentVolumeClaim" in volumes[m["name"]]
    }
    assert by_claim.keys() == set(claims)
    for claim, mount in by_claim.items():
        source = parse_source({"pvc": {"claimName": claim, "subPath": "d/m.gguf"}})
        assert isinstance(source, PvcSource)
        assert mount["mountPath"] == f"{PVC_MOUNT_ROOT}/{claim}"
        assert source.path == f"{mount['mountPath']}/d/m.gguf"
        assert mount["readOnly"] is True


@pytest.mark.parametrize("with_pvc_mounts", [False, True], ids=["as-is", "with-pvcMounts"])
def test_nothing_is_mounted_under_the_models_dir(scenario: Path, with_pvc_mounts: bool) -> None:
    """/models is the agent's --models-dir, whose scanner takes every subfolder for a model:
    the model cache is the only volume there, and nothing is mounted below it."""
    values = scenario_values(scenario)
    if with_pvc_mounts:
        claims = [{"claimName": "models"}, {"claimName": "pvc"}]
        values.setdefault("agent", {})["pvcMounts"] = claims
    rendered = Rendered(render_objects(values))
    models = PurePosixPath("/models")
    for owner, spec in pod_specs(rendered):
        for container in spec.get("initContainers", []) + spec["containers"]:
            for mount in container.get("volumeMounts", []):
                path = PurePosixPath(mount["mountPath"])
                if path == models or models in path.parents:
                    assert (owner, mount["name"], path) == (owner, "models", models)
    assert PurePosixPath(PVC_MOUNT_ROOT) != models
    assert models not in PurePosixPath(PVC_MOUNT_ROOT).parents


# --- Probes and shutdown -------------------------------------------------------------------


def test_agent_probes_health(render: Render) -> None:
    """Ready is /health (503 when the agent cannot see the GPUs it expects); alive is /livez
    (a restart would not bring the GPUs back)."""
    container = agent_container(render())
    https = {"port": "http", "scheme": "HTTPS"}  # agent.tls, on by default
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", **https}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", **https}
    plain = agent_container(render({"agent": {"tls": {"enabled": False}}}))
    assert plain["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({}, "1"),
        ({"count": 4}, "4"),
        ({"mode": "runtimeClass"}, "1"),
        ({"mode": "none"}, None),
        ({"expectVisible": False}, None),
    ],
)
def test_the_agent_expects_the_gpus_its_pod_gets(
    render: Render, gpu: dict[str, Any], expected: str | None
) -> None:
    args = agent_container(render({"agent": {"gpu": gpu}}))["args"]
    given = args[args.index("--expect-gpus") + 1] if "--expect-gpus" in args else None
    assert given == expected, args


def test_a_pools_gpu_count_is_what_its_agents_expect(render: Render) -> None:
    counts = {}
    for ds in render(POOLS).all("DaemonSet"):
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        counts[ds["metadata"]["name"]] = args[args.index("--expect-gpus") + 1]
    assert counts == {f"{FULLNAME}-agent-a100x8": "8", f"{FULLNAME}-agent-l4": "1"}


def test_operator_liveness_is_kopfs_own_probe(render: Render) -> None:
    container = operator_container(render())
    args = container["args"]
    url = args[args.index("--liveness") + 1]
    assert url == "http://0.0.0.0:8081/healthz"
    assert container["ports"] == [{"name": "health", "containerPort": 8081, "protocol": "TCP"}]
    probe = container["livenessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", "health")
    # Readiness too: nothing routes to the operator, but `helm --wait`, `kubectl rollout
    # status` and the Deployment's availability go by it (issue 25).
    assert container["readinessProbe"]["httpGet"] == probe
    assert "startupProbe" not in container


def test_grace_period_exceeds_the_stop_timeout(scenario: Path) -> None:
    rendered = Rendered(render_objects(scenario_values(scenario)))
    for ds in rendered.all("DaemonSet"):
        grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > AGENT_STOP_TIMEOUT_S
        assert grace == 60


# --- Scheduling ----------------------------------------------------------------------------


GPU_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                    ]
                },
                {
                    "matchExpressions": [
                        {
                            "key": "feature.node.kubernetes.io/pci-10de.present",
                            "operator": "In",
                            "values": ["true"],
                        }
                    ]
                },
            ]
        }
    }
}


def test_agents_go_to_gpu_nodes_by_default(render: Render) -> None:
    rendered = render()
    pod = agent_pod(rendered)
    # GPU feature discovery's label OR Node Feature Discovery's PCI label (terms are ORed).
    assert pod["affinity"] == GPU_AFFINITY
    assert "nodeSelector" not in pod
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # default requests keep the agent out of BestEffort (evicted first when a node runs short)
    assert agent_container(rendered)["resources"] == {
        "limits": {"nvidia.com/gpu": 1},
        "requests": {"cpu": "1", "memory": "4Gi"},
    }
    assert "runtimeClassName" not in pod


def test_gpu_scheduling_merges_with_the_agents_own(render: Render) -> None:
    rendered = render(
        {
            "agent": {
                "nodeSelector": {"pool": "inference"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            }
        }
    )
    pod = agent_pod(rendered)
    assert pod["nodeSelector"] == {"pool": "inference"} and pod["affinity"] == GPU_AFFINITY
    assert [t["key"] for t in pod["tolerations"]] == ["nvidia.com/gpu", "dedicated"]
    # The user's own node affinity replaces the GPU labels' one; [] drops it.
    own = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert agent_pod(render({"agent": {"affinity": own}}))["affinity"] == own
    assert "affinity" not in agent_pod(render({"agent": {"gpu": {"anyOfLabels": []}}}))
    # CPU only: no GPU scheduling at all.
    assert "affinity" not in agent_pod(render({"agent": {"gpu": {"mode": "none"}}}))


def test_runtime_class_mode_requests_no_gpu_resource(render: Render) -> None:
    rendered = render(
        {"agent": {"gpu": {"mode": "runtimeClass"}, "resources": {"limits": {"memory": "8Gi"}}}}
    )
    assert agent_pod(rendered)["runtimeClassName"] == "nvidia"
    assert agent_container(rendered)["resources"] == {"limits": {"memory": "8Gi"}}


def test_default_requests_only_where_nothing_is_set(render: Render) -> None:
    # A user's memory limit alone: no default request above it (requests must not exceed limits)
    limited = render({"agent": {"resources": {"limits": {"memory": "2Gi"}}}})
    assert "requests" not in agent_container(limited)["resources"]
    # and null turns the defaults off (Helm merges a {} into them)
    off = render({"agent": {"defaultRequests": None}})
    assert agent_container(off)["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_gpu_count_merges_with_other_limits(render: Render) -> None:
    rendered = render({"agent": {"gpu": {"count": 8}, "resources": {"limits": {"memory": "64Gi"}}}})
    assert agent_container(rendered)["resources"]["limits"] == {
        "nvidia.com/gpu": 8,
        "memory": "64Gi",
    }


def test_cpu_only_cluster(render: Render) -> None:
    rendered = render(scenario_values(CPU_ONLY))
    pod = agent_pod(rendered)
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert "runtimeClassName" not in pod
    assert agent_container(rendered)["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    assert agent_container(rendered)["image"].endswith(":0.1.0-cpu")


# --- Labels and selectors ------------------------------------------------------------------


def test_selectors_use_only_stable_labels(scenario: Path) -> None:
    rendered = Rendered(render_objects(scenario_values(scenario)))
    for obj in rendered:
        if obj["kind"] in {"DaemonSet", "Deployment"}:
            selector = obj["spec"]["selector"]["matchLabels"]
            # A pool's DaemonSet adds its pool's name, as fixed as the others.
            assert set(selector) - {"corral.dev/agent-pool"} == STABLE_LABELS, obj["kind"]
            assert selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
        elif obj["kind"] == "Service":
            assert obj["spec"]["selector"] == AGENT_SELECTOR, obj["metadata"]["name"]
    for ds in rendered.all("DaemonSet"):
        assert AGENT_SELECTOR.items() <= ds["spec"]["selector"]["matchLabels"].items()


def test_common_labels_stay_out_of_selectors(render: Render) -> None:
    rendered = render({"commonLabels": {"team": "ml"}, "agent": {"podLabels": {"tier": "gpu"}}})
    daemonset = rendered.one("DaemonSet")
    assert daemonset["metadata"]["labels"]["team"] == "ml"
    assert daemonset["spec"]["template"]["metadata"]["labels"]["tier"] == "gpu"
    assert daemonset["spec"]["selector"]["matchLabels"] == AGENT_SELECTOR


def test_services(render: Render) -> None:
    rendered = render()
    regular = rendered.one("Service", f"{FULLNAME}-agent")
    headless = rendered.one("Service", f"{FULLNAME}-agent-headless")
    assert regular["spec"]["type"] == "ClusterIP"
    assert headless["spec"]["clusterIP"] == "None"
    for service in (regular, headless):
        assert service["spec"]["ports"] == [
            {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
        ]


# --- The operator --------------------------------------------------------------------------


def test_operator_is_one_replica_recreated(render: Render) -> None:
    deployment = render().one("Deployment", f"{FULLNAME}-operator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_operator_command_is_the_contract(render: Render) -> None:
    rendered = render()
    container = operator_container(rendered)
    assert container["command"] == ["corral"]
    assert container["args"] == [
        "operator",
        "--namespace", "$(POD_NAMESPACE)",
        "--presets-configmap", f"{FULLNAME}-presets",
        "--agent-selector",
        f"app.kubernetes.io/name=corral,app.kubernetes.io/instance={RELEASE},"
        "app.kubernetes.io/component=agent",
        "--agent-port", "8080",
        "--liveness", "http://0.0.0.0:8081/healthz",
        "--agent-ca-file", "/etc/corral/agent-ca/ca.crt",
        "--agent-server-name", f"{FULLNAME}-agent.{NAMESPACE}.svc",
    ]  # fmt: skip
    assert env_of(container)["POD_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    # The selector the operator gets is exactly what the DaemonSet selects.
    selector = container["args"][container["args"].index("--agent-selector") + 1]
    pairs = dict(pair.split("=", 1) for pair in selector.split(","))
    assert pairs == rendered.one("DaemonSet")["spec"]["selector"]["matchLabels"]
    # And the ConfigMap it patches is the one the agents mount.
    assert rendered.one("ConfigMap", f"{FULLNAME}-presets")


def test_operator_disabled_renders_agents_only(render: Render) -> None:
    rendered = render({"operator": {"enabled": False}})
    assert not {"Deployment", "ClusterRole", "ClusterRoleBinding"} & rendered.kinds()
    # Only the agents' own Role (peers) is left.
    assert [r["metadata"]["name"] for r in rendered.all("Role") + rendered.all("RoleBinding")] == [
        f"{FULLNAME}-agent-peers"
    ] * 2
    assert [sa["metadata"]["name"] for sa in rendered.all("ServiceAccount")] == [
        f"{FULLNAME}-agent"
    ]
    assert rendered.one("DaemonSet") and rendered.one("ConfigMap")


# --- RBAC ----------------------------------------------------------------------------------

Rule = tuple[str, str, frozenset[str]] | tuple[str, str, frozenset[str], frozenset[str]]


def rules_of(role: Manifest) -> set[Rule]:
    """(group, resource, verbs), with the resourceNames last where a rule names its objects."""
    rules: set[Rule] = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        names = frozenset(rule.get("resourceNames") or ())
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key: Rule = (group, resource, frozenset(rule["verbs"]))
                if names:
                    key = (*key, names)
                assert key not in rules, f"duplicate rule {key}"
                rules.add(key)
    return rules


def test_cluster_role_is_minimal(render: Render) -> None:
    role = render().one("ClusterRole")
    assert rules_of(role) == {
        ("corral.dev", "modelpresets", frozenset({"list", "watch"})),
        ("corral.dev", "modelpresets/status", frozenset({"patch"})),
        ("", "nodes", frozenset({"list", "watch"})),
    }


def test_namespaced_roles_are_minimal(render: Render) -> None:
    own = render().one("Role", f"{FULLNAME}-operator")
    assert own["metadata"]["namespace"] == NAMESPACE
    assert rules_of(own) == {
        ("", "configmaps", frozenset({"list", "watch", "create"})),
        # Issue 16 row 18: only the presets ConfigMap may be patched.
        ("", "configmaps", frozenset({"patch"}), frozenset({f"{FULLNAME}-presets"})),
        ("", "pods", frozenset({"list", "watch", "patch"})),
        ("", "services", frozenset({"list", "watch", "create", "patch", "delete"})),
    }
    # Events about cluster-scoped ModelPresets must be in `default` (apiserver validation).
    events = render().one("Role", f"{FULLNAME}-operator-events")
    assert events["metadata"]["namespace"] == "default"
    assert rules_of(events) == {("", "events", frozenset({"create"}))}
    # The agents: their Service's EndpointSlices (peers), read-only, in their namespace.
    peers = render().one("Role", f"{FULLNAME}-agent-peers")
    assert peers["metadata"]["namespace"] == NAMESPACE
    assert rules_of(peers) == {("discovery.k8s.io", "endpointslices", frozenset({"list", "watch"}))}


def test_no_wildcards_and_no_secret_access(scenario: Path) -> None:
    rendered = Rendered(render_objects(scenario_values(scenario)))
    for role in rendered.all("ClusterRole") + rendered.all("Role"):
        for group, resource, verbs, *_ in rules_of(role):
            assert "*" not in {group, resource} | verbs
            assert resource != "secrets"
            assert not verbs & {"escalate", "bind", "impersonate", "update", "deletecollection"}


def test_bindings_grant_each_role_to_its_own_service_account(render: Render) -> None:
    rendered = render()
    operator = {"kind": "ServiceAccount", "name": f"{FULLNAME}-operator", "namespace": NAMESPACE}
    agent = {"kind": "ServiceAccount", "name": f"{FULLNAME}-agent", "namespace": NAMESPACE}
    bindings = rendered.all("ClusterRoleBinding") + rendered.all("RoleBinding")
    roles = rendered.all("ClusterRole") + rendered.all("Role")
    assert len(bindings) == len(roles) == 4
    for binding in bindings:
        peers = binding["metadata"]["name"] == f"{FULLNAME}-agent-peers"
        assert binding["subjects"] == [agent if peers else operator]
        role_kind = binding["kind"].removesuffix("Binding")
        role = rendered.one(role_kind, binding["roleRef"]["name"])
        assert role["metadata"].get("namespace") == binding["metadata"].get("namespace")
        assert binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == operator["name"]
    assert agent_pod(rendered)["serviceAccountName"] == agent["name"]


# --- helm test, ServiceMonitor, CRD --------------------------------------------------------


def test_helm_test_pod_calls_health_and_models(render: Render) -> None:
    pod = render().one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    script = container["command"][-1]
    base = f"https://{FULLNAME}-agent.{NAMESPACE}.svc:8080"
    assert f'base="{base}"' in script
    assert "--cacert /etc/corral/agent-ca/ca.crt" in script
    assert '"$base/health"' in script and '"$base/v1/models"' in script
    assert "curl -fsS" in script  # -f: an HTTP error fails the test


def test_service_monitor_scrapes_each_agent_once(render: Render) -> None:
    assert "ServiceMonitor" not in render().kinds()
    rendered = render({"serviceMonitor": {"enabled": True}})
    monitor = rendered.one("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    matching = [
        s["metadata"]["name"]
        for s in rendered.all("Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert matching == [f"{FULLNAME}-agent-headless"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"]["name"] == f"{FULLNAME}-api-key"
    off = render({"serviceMonitor": {"enabled": True}, "agent": {"apiKey": {"enabled": False}}})
    assert "authorization" not in off.one("ServiceMonitor")["spec"]["endpoints"][0]


def test_service_monitor_sends_the_scrape_key_not_the_api_key(render: Render) -> None:
    """Issue 25: the monitoring stack held the inference key. The scrape key opens GET
    /metrics only (the agent's $CORRAL_METRICS_KEY)."""
    rendered = render(scenario_values(API_KEY))
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "corral-api-key", "key": "metrics-key"},
    }
    scrape = {"name": "corral-api-key", "key": "metrics-key", "optional": True}
    assert env_of(agent_container(rendered))["CORRAL_METRICS_KEY"]["valueFrom"] == {
        "secretKeyRef": scrape
    }
    assert "CORRAL_METRICS_KEY" not in env_of(operator_container(rendered))
    generated = render().one("Secret", f"{FULLNAME}-api-key")["data"]
    keys = {name: base64.b64decode(value).decode() for name, value in generated.items()}
    assert set(keys) == {"api-key", "metrics-key"} and keys["api-key"] != keys["metrics-key"]
    assert len(keys["metrics-key"]) == 48 and keys["metrics-key"].isalnum()


def test_crd_comes_from_crds_dir(render: Render) -> None:
    crd = render().one("CustomResourceDefinition")
    with (REPO / "crds" / "modelpresets.corral.dev.yaml").open() as f:
        source = yaml.safe_load(f)
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == source["metadata"]["name"] == "modelpresets.corral.dev"
    assert crd["spec"]["group"] == "corral.dev"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["plural"] == "modelpresets"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_crd_behind_crds_enabled(render: Render) -> None:
    assert "CustomResourceDefinition" not in render({"crds": {"enabled": False}}).kinds()
    crd = render({"crds": {"keep": False}}).one("CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_chart_crd_copy_is_byte_identical_to_crds_dir() -> None:
    """crds/ is the one source; charts/corral/files/crds/ is its copy (hack/sync-crd.sh)."""
    sources = {p.name: p.read_bytes() for p in sorted((REPO / "crds").glob("*.yaml"))}
    copies = {p.name: p.read_bytes() for p in sorted((CHART / "files" / "crds").glob("*.yaml"))}
    assert sources, "crds/ holds no CRD"
    assert sorted(copies) == sorted(sources), "run hack/sync-crd.sh"
    for name, data in sources.items():
        drifted = f"charts/corral/files/crds/{name} drifted: run hack/sync-crd.sh"
        assert copies[name] == data, drifted


def test_notes_render(render: Render) -> None:
    notes = render_templates({})["corral/templates/NOTES.txt"]
    assert f"svc/{FULLNAME}-agent" in notes
    assert "kubectl wait --for=condition=Ready modelpreset/" in notes
    notes = render_templates(scenario_values(API_KEY))["corral/templates/NOTES.txt"]
    assert "corral-api-key" in notes


# --- GPU pools -----------------------------------------------------------------------------

POOLS = {
    "agent": {
        "pools": [
            {
                "name": "a100x8",
                "nodeSelector": {"gpu": "a100"},
                "gpuCount": 8,
                "resources": {"requests": {"memory": "64Gi"}},
            },
            {"name": "l4", "nodeSelector": {"gpu": "l4"}, "extraArgs": ["-c", "4096"]},
        ]
    }
}


def test_gpu_pools_get_a_daemonset_each_under_one_operator(render: Render) -> None:
    rendered = render(POOLS)
    daemonsets = {d["metadata"]["name"]: d for d in rendered.all("DaemonSet")}
    assert set(daemonsets) == {f"{FULLNAME}-agent-a100x8", f"{FULLNAME}-agent-l4"}
    a100, l4 = daemonsets[f"{FULLNAME}-agent-a100x8"], daemonsets[f"{FULLNAME}-agent-l4"]
    for ds, pool in ((a100, "a100x8"), (l4, "l4")):
        selector = ds["spec"]["selector"]["matchLabels"]
        # Disjoint selectors (a DaemonSet must not adopt another's pods), each still an agent.
        assert selector == {**AGENT_SELECTOR, "corral.dev/agent-pool": pool}
        assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    spec = {name: d["spec"]["template"]["spec"] for name, d in (("a100", a100), ("l4", l4))}
    assert spec["a100"]["nodeSelector"] == {"gpu": "a100"}
    assert spec["l4"]["nodeSelector"] == {"gpu": "l4"}
    assert spec["a100"]["affinity"] == spec["l4"]["affinity"] == GPU_AFFINITY
    (a100_agent,) = spec["a100"]["containers"]
    (l4_agent,) = spec["l4"]["containers"]
    # a pool's own resources replace the defaults; a pool without them gets the default requests
    assert a100_agent["resources"] == {
        "limits": {"nvidia.com/gpu": 8},
        "requests": {"memory": "64Gi"},
    }
    assert l4_agent["resources"] == {
        "limits": {"nvidia.com/gpu": 1},
        "requests": {"cpu": "1", "memory": "4Gi"},
    }
    assert l4_agent["args"][-2:] == ["-c", "4096"] and "4096" not in a100_agent["args"]
    # One operator, one CRD; its agent selector matches every pool's pods.
    assert (
        len(rendered.all("Deployment")) == 1 and len(rendered.all("CustomResourceDefinition")) == 1
    )
    args = operator_container(rendered)["args"]
    selector = dict(kv.split("=") for kv in args[args.index("--agent-selector") + 1].split(","))
    for ds in (a100, l4):
        assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_without_pools_the_daemonset_keeps_its_name_and_selector(render: Render) -> None:
    # A DaemonSet's selector is immutable: the default must not change on upgrade.
    (ds,) = render().all("DaemonSet")
    assert ds["metadata"]["name"] == f"{FULLNAME}-agent"
    assert ds["spec"]["selector"]["matchLabels"] == AGENT_SELECTOR


@pytest.mark.parametrize(
    "pool",
    [
        {"name": "Bad_Name", "nodeSelector": {"a": "b"}},
        {"name": "x"},
        {"name": "x", "nodeSelector": {}},
    ],
)
def test_a_pool_needs_a_name_and_a_node_selector(pool: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError, match="/agent/pools/0"):
        helm_python.Chart.load(CHART).validate_schema(with_images({"agent": {"pools": [pool]}}))


@pytest.mark.parametrize(
    ("label", "term"),
    [
        ("cloud.google.com/gke-accelerator", {"operator": "Exists"}),
        ("nvidia.com/gpu.present=true", {"operator": "In", "values": ["true"]}),
        (
            "nvidia.com/gpu.product in (NVIDIA-L4, NVIDIA-A100)",
            {"operator": "In", "values": ["NVIDIA-L4", "NVIDIA-A100"]},
        ),
    ],
    ids=["key-alone", "key=value", "key-in-set"],
)
def test_any_of_labels_takes_the_three_forms(
    render: Render, label: str, term: dict[str, Any]
) -> None:
    # GKE labels GPU nodes cloud.google.com/gke-accelerator=<model>: "any value" must be sayable.
    pod = agent_pod(render({"agent": {"gpu": {"anyOfLabels": [label]}}}))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    key = label.split("=")[0].split(" in ")[0]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [{"key": key, **term}]}]


@pytest.mark.parametrize("label", ["a b", "k in ()", "k=(x)", "k in (a", "=v"])
def test_any_of_labels_refuses_other_shapes(label: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render_objects({"agent": {"gpu": {"anyOfLabels": [label]}}})


def test_resource_mode_can_also_set_the_runtime_class(render: Render) -> None:
    assert "runtimeClassName" not in agent_pod(render())
    pod = agent_pod(render({"agent": {"gpu": {"useRuntimeClass": True}}}))
    assert pod["runtimeClassName"] == "nvidia"
    assert agent_container(render({"agent": {"gpu": {"useRuntimeClass": True}}}))["resources"][
        "limits"
    ] == {"nvidia.com/gpu": 1}
    # In mode none there is no GPU, so no runtime class either.
    none = {"agent": {"gpu": {"mode": "none", "useRuntimeClass": True}}}
    assert "runtimeClassName" not in agent_pod(render(none))


def test_agents_get_a_priority_class_of_their_own(render: Render) -> None:
    rendered = render()
    pc = rendered.one("PriorityClass", f"{FULLNAME}-agent")
    assert pc["value"] == 1000000 and pc["preemptionPolicy"] == "PreemptLowerPriority"
    assert pc["globalDefault"] is False
    assert agent_pod(rendered)["priorityClassName"] == f"{FULLNAME}-agent"
    mine = render({"agent": {"priorityClassName": "gpu-critical"}})
    assert "PriorityClass" not in mine.kinds()
    assert agent_pod(mine)["priorityClassName"] == "gpu-critical"
    off = render({"agent": {"priorityClass": {"create": False}}})
    assert "priorityClassName" not in agent_pod(off)


def test_a_network_policy_admits_the_operator_the_agents_and_the_clients(render: Render) -> None:
    policy = render().one("NetworkPolicy", f"{FULLNAME}-agent")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    components = [
        p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
        for p in rule["from"]
    ]
    assert components == ["agent", "operator", None]
    assert rule["from"][2] == {"namespaceSelector": {}}
    assert "NetworkPolicy" not in render({"networkPolicy": {"enabled": False}}).kinds()


def test_operator_has_resources_and_a_readiness_probe(render: Render) -> None:
    container = operator_container(render())
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_events_in_default_are_optional(render: Render) -> None:
    # The only object outside the release namespace is the Events Role (and its binding).
    rendered = render()
    assert {r["metadata"]["namespace"] for r in rendered.all("Role")} == {NAMESPACE, "default"}
    assert "--no-events" not in operator_container(rendered)["args"]
    off = render({"operator": {"events": False}})
    assert {r["metadata"]["namespace"] for r in off.all("Role")} == {NAMESPACE}
    assert {b["metadata"]["namespace"] for b in off.all("RoleBinding")} == {NAMESPACE}
    assert "--no-events" in operator_container(off)["args"]


def test_agents_serve_https_checked_by_their_services_name(render: Render) -> None:
    """Issue 25: peers forwarded prompts and the API key in plain HTTP. By default the chart
    generates a CA and a certificate for the agents' Service; every client of the agents
    checks it against that CA, by that name (pods are reached at IPs no certificate names)."""
    rendered = render({"serviceMonitor": {"enabled": True}})
    name = f"{FULLNAME}-agent.{NAMESPACE}.svc"
    secret = rendered.one("Secret", f"{FULLNAME}-agent-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    args = agent_container(rendered)["args"]

    def value(flag: str) -> str:
        return str(args[args.index(flag) + 1])

    assert value("--ssl-cert-file") == "/etc/corral/tls/tls.crt"
    assert value("--ssl-key-file") == "/etc/corral/tls/tls.key"
    assert (value("--peer-ca-file"), value("--peer-server-name")) == (
        "/etc/corral/tls/ca.crt",
        name,
    )
    volumes = {v["name"]: v for v in agent_pod(rendered)["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": f"{FULLNAME}-agent-tls"}
    # The operator and the test pod get the CA only, never the key.
    operator_volumes = {
        v["name"]: v
        for v in rendered.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"][
            "volumes"
        ]
    }
    ca_only = {
        "secretName": f"{FULLNAME}-agent-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert operator_volumes["agent-ca"]["secret"] == ca_only
    assert rendered.one("Pod")["spec"]["volumes"][0]["secret"] == ca_only
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": f"{FULLNAME}-agent-tls", "key": "ca.crt"}},
        "serverName": name,
    }
    # The user's Secret (cert-manager's layout) instead: nothing generated.
    theirs = render({"agent": {"tls": {"existingSecret": "agents-cert"}}})
    assert f"{FULLNAME}-agent-tls" not in {o["metadata"]["name"] for o in theirs.all("Secret")}
    assert {v["name"]: v for v in agent_pod(theirs)["volumes"]}["tls"]["secret"] == {
        "secretName": "agents-cert"
    }
    # Off: plain HTTP, no flag, no volume, no Secret.
    off = render({"agent": {"tls": {"enabled": False}}, "serviceMonitor": {"enabled": True}})
    off_args = agent_container(off)["args"]
    assert not {"--ssl-cert-file", "--peer-ca-file"} & set(off_args)
    assert "tls" not in {v["name"] for v in agent_pod(off)["volumes"]}
    assert off.one("ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "http"
    assert "--agent-ca-file" not in operator_container(off)["args"]


def test_agent_probes_keep_a_scheme_they_say_and_other_kinds(render: Render) -> None:
    """With agent.tls an httpGet probe without a scheme gets HTTPS; one that says its scheme,
    and a probe of another kind, are left as given."""
    probes = {
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http", "scheme": "HTTP"}},
        # (null drops the default's httpGet: Helm merges values)
        "livenessProbe": {"httpGet": None, "tcpSocket": {"port": "http"}},
    }
    container = agent_container(render({"agent": probes}))
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert "httpGet" not in container["livenessProbe"]
    assert container["livenessProbe"]["tcpSocket"] == {"port": "http"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"agent": {"tls": {"enabled": False, "existingSecret": "agents-cert"}}},
            'agent.tls.existingSecret "agents-cert" is given but agent.tls.enabled is false',
        ),
        (
            {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}},
            'serviceMonitor.namespace "monitoring": the ServiceMonitor checks the agents\' '
            "certificate with the ca.crt of the Secret",
        ),
        # The InferencePool: its rendering is checked in tests/cluster, where the real helm
        # sees the extension's CRDs; Helm's engine here knows no cluster's API versions.
        (
            {"inferencePool": {"enabled": True}},
            "inferencePool.enabled needs agent.tls.enabled=false: a gateway sends requests "
            "straight to the agents' port",
        ),
        (
            {"inferencePool": {"enabled": True}, "agent": {"tls": {"enabled": False}}},
            "the cluster has no inference.networking.k8s.io/v1/InferencePool: install the "
            "Gateway API Inference Extension's CRDs first",
        ),
        (
            {
                "inferencePool": {"enabled": True, "metricsPort": 8080},
                "agent": {"tls": {"enabled": False}},
            },
            "inferencePool.metricsPort 8080 is agent.port too",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused(
    render: Render, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(values)


def test_without_an_inference_pool_the_agents_serve_no_routing_metrics(render: Render) -> None:
    rendered = render()
    assert "--routing-metrics-port" not in agent_container(rendered)["args"]
    assert [p["name"] for p in agent_container(rendered)["ports"]] == ["http"]
    (policy,) = rendered.all("NetworkPolicy")
    assert [r["ports"][0]["port"] for r in policy["spec"]["ingress"]] == ["http"]
