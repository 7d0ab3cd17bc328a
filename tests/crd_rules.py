"""The apiserver's two validation passes for ModelPreset objects, played here: the CRD's OpenAPI
schema (jsonschema, unknown fields refused as ``kubectl --validate=strict`` would) and every
``x-kubernetes-validations`` rule evaluated with Google's CEL (cel-cpp with the strings
extension, as Kubernetes enables it), transition rules with ``oldSelf``.

Shared by the CRD's unit tests and the operator tier's strict emulator, which refuses a
ModelPreset the apiserver would refuse.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no types-jsonschema in the test extra
import yaml
from cel_expr_python import cel
from cel_expr_python.ext import ext_strings

ROOT = Path(__file__).resolve().parents[1]
CRD = yaml.safe_load((ROOT / "crds" / "modelpresets.corral.dev.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

_ENV = cel.NewEnv(
    variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN},
    extensions=[ext_strings.ExtStrings()],
)


# --- a small model of the apiserver's validation ----------------------------------------------
def _json_schema(node: Any) -> Any:
    """OpenAPI (structural) → JSON Schema; objects with properties refuse unknown fields."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("type", None)
    elif (
        "properties" in node
        and "additionalProperties" not in node
        and node is not SCHEMA["properties"].get("metadata")
    ):
        out["additionalProperties"] = False
    return out


def _rules(
    schema: dict[str, Any], value: Any, old: Any, path: str
) -> Iterator[tuple[str, str, Any, Any]]:
    """(path, rule, self, oldSelf) for every rule whose value is present, walking schema + value."""
    for r in schema.get("x-kubernetes-validations", []):
        yield path, r["rule"], value, old
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                prev = old.get(key) if isinstance(old, dict) else None
                yield from _rules(sub, value[key], prev, f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                prev = old.get(key) if isinstance(old, dict) else None
                yield from _rules(extra, value[key], prev, f"{path}[{key}]")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _rules(schema["items"], item, None, f"{path}[{i}]")


@functools.cache
def _compiled(rule: str) -> Any:
    return _ENV.compile(rule)


def cel_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Messages of the CEL rules ``obj`` breaks (transition rules only on update, when the old
    value exists too — the apiserver's rule)."""
    messages = {r["rule"]: r.get("message", r["rule"]) for _, r in _all_rules(SCHEMA)}
    errors = []
    for path, rule, value, prev in _rules(SCHEMA, obj, old, ""):
        if "oldSelf" in rule and (old is None or prev is None):
            continue
        result = _compiled(rule).eval(data={"self": value, "oldSelf": prev}).value()
        if result is not True:
            errors.append(f"{path or '<root>'}: {messages[rule]}")
    return errors


def schema_errors(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(_json_schema(SCHEMA))
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]


def errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return schema_errors(obj) + cel_errors(obj, old)


def _all_rules(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        for r in node.get("x-kubernetes-validations", []):
            yield path, r
        for key, sub in node.items():
            if key != "x-kubernetes-validations":
                yield from _all_rules(sub, f"{path}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _all_rules(sub, f"{path}/{i}")


def mp(name: str = "good", **spec: Any) -> dict[str, Any]:
    spec.setdefault("source", {"localPath": {"path": "/models/a.gguf"}})
    return {
        "apiVersion": "corral.dev/v1alpha1",
        "kind": "ModelPreset",
        "metadata": {"name": name},
        "spec": spec,
    }
