"""The chart renders, lints and validates against the Kubernetes schemas in every scenario."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.chart.rendering import CHART, SCENARIOS, Rendered, render_objects, scenario_values

KUBE_VERSION = "1.35"

# Custom resources have no schema in kubernetes-validate (it raises SchemaNotFoundError):
# they are skipped by name, never by catching that error, so that a typo in a built-in kind
# cannot pass as "unknown". The CRD object itself (apiextensions.k8s.io/v1) IS validated.
CUSTOM_RESOURCE_GROUPS = {"monitoring.coreos.com"}


def test_scenarios_exist() -> None:
    names = {p.name for p in SCENARIOS}
    assert names >= {
        "default-values.yaml",
        "cpu-only-values.yaml",
        "pvc-cache-values.yaml",
        "operator-disabled-values.yaml",
        "servicemonitor-values.yaml",
        "api-key-values.yaml",
    }


def test_scenario_validates_against_values_schema(scenario: Path) -> None:
    helm_python.Chart.load(CHART).validate_schema(scenario_values(scenario))


def test_scenario_lints_strictly(scenario: Path) -> None:
    report = helm_python.lint(
        CHART, scenario_values(scenario), strict=True, kube_version=f"v{KUBE_VERSION}.0"
    )
    assert report["errors"] == []
    # severity: 1 info, 2 warning, 3 error. Strict lint fails on warnings; so do we. The only
    # info Helm reports is "icon is recommended".
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_scenario_objects_validate_against_kubernetes_schemas(scenario: Path) -> None:
    objects = render_objects(scenario_values(scenario))
    assert objects
    validated = 0
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        if group in CUSTOM_RESOURCE_GROUPS:
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        validated += 1
    assert validated >= len(objects) - 1


def test_every_object_is_namespaced_in_the_release_or_cluster_scoped(scenario: Path) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "PriorityClass",
    }
    for obj in Rendered(render_objects(scenario_values(scenario))):
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, obj["kind"]
        elif obj["metadata"]["name"].endswith("-operator-events"):
            # Events about cluster-scoped ModelPresets can only be posted in `default`.
            assert namespace == "default" and obj["kind"] in {"Role", "RoleBinding"}
        else:
            assert namespace == "corral-system", f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize(
    ("values", "pointer"),
    [
        ({"agent": {"gpu": {"mode": "mig"}}}, "/agent/gpu/mode"),
        ({"agent": {"image": {"variant": "rocm"}}}, "/agent/image/variant"),
        ({"agent": {"terminationGracePeriodSeconds": 10}}, "/agent/terminationGracePeriodSeconds"),
        ({"agent": {"modelsMax": "four"}}, "/agent/modelsMax"),
        ({"agent": {"port": 70000}}, "/agent/port"),
        ({"agent": {"modelCache": {"type": "nfs"}}}, "/agent/modelCache/type"),
        ({"agent": {"modelCache": {"type": "persistentVolumeClaim"}}}, "/agent/modelCache"),
        ({"agent": {"modelCache": {"hostPath": {"path": "relative/dir"}}}}, "/agent/modelCache"),
        ({"agent": {"memoryLimits": {"host": "lots"}}}, "/agent/memoryLimits/host"),
        ({"agent": {"extraArgs": "--ctx-size 8192"}}, "/agent/extraArgs"),
        ({"agent": {"pvcMounts": [{"claimName": "Bad_Name"}]}}, "/agent/pvcMounts/0/claimName"),
        ({"operator": {"enabled": "yes"}}, "/operator/enabled"),
        ({"operator": {"image": {"digest": "latest"}}}, "/operator/image/digest"),
        ({"serviceMonitor": {"enable": True}}, "serviceMonitor"),
        ({"agnet": {}}, "agnet"),
    ],
)
def test_values_schema_rejects(values: dict[str, Any], pointer: str) -> None:
    chart = helm_python.Chart.load(CHART)
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(pointer)):
        chart.validate_schema(values)
    # An install renders with the same check.
    with pytest.raises(helm_python.HelmValuesError):
        chart.render(values, name="llm", namespace="corral-system", is_install=True)


def _schema_paths(schema: dict[str, Any], root: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of every value the schema declares (free-form objects stop the walk)."""
    if "$ref" in schema:
        name = schema["$ref"].rpartition("/")[2]
        schema = root["definitions"][name]
    paths: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        paths |= _schema_paths(sub, root, path + ".")
    return paths


def _commented_value_paths(values_yaml: str) -> tuple[set[str], set[str]]:
    """(all key paths, key paths documented by a comment) of values.yaml.

    A key is documented when a comment precedes it or precedes the run of sibling keys
    (no blank line between) that it belongs to, the way node-exporter's values.yaml groups
    `nodeSelector`/`tolerations`/`affinity` under one comment.
    """
    stack: list[tuple[int, str]] = []
    all_paths: set[str] = set()
    documented: set[str] = set()
    run_documented = False
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if not stripped:
            run_documented = False
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            run_documented = True
            continue
        match = re.match(r"([A-Za-z0-9_.\-/\"]+):(\s|$)", stripped)
        if not match or stripped.startswith("- "):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack] + [match.group(1).strip('"')])
        stack.append((indent, match.group(1).strip('"')))
        all_paths.add(path)
        if run_documented:
            documented.add(path)
        # A key that opens a block starts a new run for its children.
        if stripped.endswith(":"):
            run_documented = False
    return all_paths, documented


def test_every_value_is_commented() -> None:
    values_yaml = (CHART / "values.yaml").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    declared = _schema_paths(schema, schema)
    present, documented = _commented_value_paths(values_yaml)
    undocumented = sorted((declared & present) - documented)
    assert undocumented == []
    # Every declared value appears in values.yaml (with its default), and vice versa.
    assert sorted(declared - present) == []
