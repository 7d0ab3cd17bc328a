"""Render charts/corral with Helm's own engine (helm-python-sdk: Helm's Go SDK, no binary).

Renders are cached per values, so every test module reads the same manifests.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "corral"
SCENARIOS = sorted(CHART.glob("ci/*-values.yaml"))
RELEASE = "llm"
NAMESPACE = "corral-system"
FULLNAME = "llm-corral"

Manifest = dict[str, Any]


# No image is published, so a user must name both (the chart refuses to render without them).
IMAGES: dict[str, Any] = {
    "agent": {"image": {"repository": "registry.example.com/corral/corral-agent"}},
    "operator": {"image": {"repository": "registry.example.com/corral/corral-operator"}},
}


def scenario_values(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return yaml.safe_load(f) or {}


def with_images(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` on top of IMAGES (nested maps merge, as Helm merges values files)."""

    def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in top.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merge(out[key], value) if both else value
        return out

    return merge(IMAGES, values)


@functools.cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


@functools.cache
def _render(values_json: str) -> dict[str, str]:
    return _chart().render(
        json.loads(values_json), name=RELEASE, namespace=NAMESPACE, is_install=True
    )


def render_templates(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path → rendered text (NOTES.txt included), for a user who set the images."""
    return _render(json.dumps(with_images(values or {}), sort_keys=True))


def render_objects(values: dict[str, Any] | None = None) -> list[Manifest]:
    """Every Kubernetes object the chart renders, in template order."""
    objects: list[Manifest] = []
    for path, text in sorted(render_templates(values).items()):
        if path.endswith(".txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


class Rendered:
    """The objects of one render, looked up by kind (and name)."""

    def __init__(self, objects: list[Manifest]) -> None:
        self.objects = objects

    def __iter__(self) -> Iterator[Manifest]:
        return iter(self.objects)

    def all(self, kind: str) -> list[Manifest]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = [o for o in self.all(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {o["kind"] for o in self.objects}


def pod_specs(rendered: Rendered) -> Iterator[tuple[str, Manifest]]:
    """(owner, pod spec) of every pod the chart renders, workloads and the test pod."""
    for obj in rendered:
        if obj["kind"] in {"DaemonSet", "Deployment"}:
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield f"Pod/{obj['metadata']['name']}", obj["spec"]
