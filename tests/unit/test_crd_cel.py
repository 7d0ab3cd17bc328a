"""The ModelPreset CRD: structural schema, bounds, CEL rules (cel-expr-python), examples.

The apiserver is not available here, so this file plays its two validation passes on samples:
the OpenAPI schema (jsonschema, with unknown fields refused as ``kubectl --validate=strict``
would) and every ``x-kubernetes-validations`` rule evaluated with Google's CEL (cel-cpp with the
strings extension, as Kubernetes enables it), transition rules with ``oldSelf``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from preset_operator.render import render

from node_agent.sources.options import generated_options
from node_agent.sources.preset_env import ALLOWED_ENV, VALUE_PATTERN
from node_agent.sources.trust import allowed_flags
from tests.crd_rules import (
    _ENV,
    CRD,
    EXAMPLES,
    SCHEMA,
    VERSION,
    _all_rules,
    cel_errors,
    errors,
    mp,
    schema_errors,
)


# --- the CRD object itself ------------------------------------------------------------------
def test_crd_is_a_valid_apiextensions_object() -> None:
    kubernetes_validate.validate(CRD, "1.35", strict=True)
    assert CRD["spec"]["scope"] == "Cluster" and CRD["spec"]["names"]["shortNames"] == ["cmp"]
    assert VERSION["subresources"] == {"status": {}}
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"]]
    assert columns == ["MODEL", "NODES", "LOADED", "READY", "REASON", "AGE"]


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}[*]")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")


def test_schema_is_structural_and_bounded() -> None:
    """The apiserver's structural-schema rules we can break, plus our own bounds policy."""
    problems = []
    for path, node in _walk(SCHEMA, ""):
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "type" not in node and not preserve:
            problems.append(f"{path}: no type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties together")
        if node.get("additionalProperties") is False:
            problems.append(f"{path}: additionalProperties: false is not structural")
        for bad in (
            "$ref",
            "definitions",
            "dependencies",
            "patternProperties",
            "oneOf",
            "anyOf",
            "not",
        ):
            if bad in node:
                problems.append(f"{path}: {bad} is not allowed")
        if node.get("uniqueItems"):
            problems.append(f"{path}: uniqueItems is not allowed")
        if "items" in node and not isinstance(node["items"], dict):
            problems.append(f"{path}: items must be one schema")
        t = node.get("type")
        if t == "array" and "maxItems" not in node:
            problems.append(f"{path}: array without maxItems")
        if (
            t == "string"
            and "maxLength" not in node
            and "enum" not in node
            and path not in (".apiVersion", ".kind")
        ):
            problems.append(f"{path}: string without maxLength")
        if (
            t == "object"
            and isinstance(node.get("additionalProperties"), dict)
            and "maxProperties" not in node
        ):
            problems.append(f"{path}: map without maxProperties")
        if node.get("x-kubernetes-list-type") == "map":
            keys = node.get("x-kubernetes-list-map-keys") or []
            if not keys or not set(keys) <= set(node["items"].get("required", [])):
                problems.append(f"{path}: list-map keys must be required")
    # metadata may only be {type: object} (or constrain name/generateName).
    assert SCHEMA["properties"]["metadata"] == {"type": "object"}
    assert problems == []


def test_every_rule_compiles() -> None:
    rules = list(_all_rules(SCHEMA))
    assert len(rules) == 10
    for _, r in rules:
        _ENV.compile(r["rule"])
        assert r.get("message")


def test_the_crd_lists_the_agents_allow_list() -> None:
    """One source: the CEL rule's flags are the agent's allow-list (hack/gen-crd-allowlist.py
    writes them; rerun it when this fails)."""
    rule = next(r["rule"] for _, r in _all_rules(SCHEMA) if "--ctx-size" in r["rule"])
    listed = set(re.findall(r"'(-[^']+)'", rule.split("in [", 1)[1].split("]", 1)[0]))
    assert listed == set(allowed_flags(generated_options()))


def test_the_crd_lists_the_agents_env_allow_list_and_value_pattern() -> None:
    """spec.env: the same names as the agent's ALLOWED_ENV (the generated rule) and the same
    values as its VALUE_PATTERN (the schema's pattern and maxLength)."""
    rule = next(r["rule"] for _, r in _all_rules(SCHEMA) if "CUDA_VISIBLE_DEVICES" in r["rule"])
    assert set(re.findall(r"'([A-Z_]+)'", rule)) == ALLOWED_ENV
    values = SCHEMA["properties"]["spec"]["properties"]["env"]["additionalProperties"]
    assert f"{values['pattern'][1:-2]}{{0,{values['maxLength']}}}" == VALUE_PATTERN


# --- each rule rejects what it should -------------------------------------------------------
def test_valid_samples_pass() -> None:
    assert errors(mp()) == []
    assert (
        errors(
            mp(
                modelName="org/repo:Q4_K_M",
                aliases=["a", "b"],
                args=["--ctx-size", "4096", "-ngl", "-1"],
            )
        )
        == []
    )
    assert errors(mp(source={"pvc": {"claimName": "models", "subPath": "dir/x.gguf"}})) == []
    assert errors(mp(source={"huggingFace": {"repo": "org/repo"}})) == []
    assert (
        errors(
            mp(
                placement={"nodeSelector": {"gpu": "a100"}},
                lifecycle={"loadOnStartup": True, "ttl": 60},
            )
        )
        == []
    )


def test_env_of_device_and_memory_variables_passes() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "GGML_CUDA_ENABLE_UNIFIED_MEMORY": "1"}
    assert errors(mp(env=env)) == []
    assert errors(mp(env={"ONEAPI_DEVICE_SELECTOR": "level_zero:0"})) == []


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"LD_PRELOAD": "/tmp/x.so"}, "env may only set device and memory variables"),
        ({"GGML_BACKEND_PATH": "x"}, "env may only set device and memory variables"),
        ({"LLAMA_ARG_MODEL": "x"}, "env may only set device and memory variables"),
        ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "env may only set device and memory variables"),
        ({"CUDA_VISIBLE_DEVICES": "../0"}, "does not match"),
        ({"CUDA_VISIBLE_DEVICES": "0;rm"}, "does not match"),
        ({f"V{i}": "1" for i in range(17)}, "too many properties"),
    ],
)
def test_env_off_the_allow_list_is_refused(env: dict[str, str], says: str) -> None:
    assert any(says in e for e in errors(mp(env=env))), errors(mp(env=env))


@pytest.mark.parametrize("name", ["qwen2.5", "Upper", "9lives", "a" * 64, "trailing-"])
def test_name_must_be_a_dns1035_label(name: str) -> None:
    assert [e for e in errors(mp(name)) if "DNS-1035" in e]


@pytest.mark.parametrize(
    "source",
    [
        {},
        {"localPath": {"path": "/a"}, "huggingFace": {"repo": "o/r"}},
        {
            "url": {"url": "https://x/a.gguf", "sha256": "a" * 64},
            "pvc": {"claimName": "c", "subPath": "a"},
        },
    ],
)
def test_exactly_one_source(source: dict[str, Any]) -> None:
    assert any("exactly one of source" in e for e in errors(mp(source=source)))


@pytest.mark.parametrize(
    "arg",
    [
        *("--port", "--host", "-m", "--model", "--model-url", "--hf-repo", "--alias"),
        *("--api-key", "--ssl-key-file", "--path", "--port=8080", "--host=0.0.0.0"),
        *("--models-dir", "--models-max=2", "--no-models-autoload", "--port-range-x"),
    ],
)
def test_args_off_the_allow_list_are_refused(arg: str) -> None:
    assert any("args may only set" in e for e in cel_errors(mp(args=["--ctx-size", "1", arg, "x"])))


@pytest.mark.parametrize(
    "args",
    [
        ["--ctx-size", "4096"],
        ["-c", "8192", "--n-gpu-layers", "-1"],
        ["--chat-template=-x"],
        ["--no-repack", "--flash-attn", "on"],
    ],
)
def test_ordinary_args_pass(args: list[str]) -> None:
    assert cel_errors(mp(args=args)) == []


def test_aliases_unique_and_not_the_model_name() -> None:
    assert any("unique" in e for e in errors(mp(aliases=["a", "b", "a"])))
    assert any("may not contain the model name" in e for e in errors(mp("good", aliases=["good"])))
    assert any(
        "may not contain the model name" in e for e in errors(mp(modelName="m", aliases=["m"]))
    )
    assert errors(mp("good", modelName="m", aliases=["good"])) == []


def test_model_name_is_immutable() -> None:
    old = mp("good", modelName="m1")
    assert any(
        "spec.modelName is immutable" in e for e in cel_errors(mp("good", modelName="m2"), old)
    )
    # Adding or removing spec.modelName changes the effective name: the root rule catches it.
    assert any("model name" in e for e in cel_errors(mp("good", modelName="other"), mp("good")))
    assert any("model name" in e for e in cel_errors(mp("good"), old))
    # Spelling out the default is not a change.
    assert cel_errors(mp("good", modelName="good"), mp("good")) == []
    assert cel_errors(mp("good", modelName="m1", args=["-c", "1"]), old) == []


def test_hugging_face_revision_needs_file() -> None:
    """The agent pins one named file (preset ``hf-revision`` needs ``hf-file``)."""

    def hf(**source: str) -> dict[str, Any]:
        return mp(source={"huggingFace": {"repo": "org/repo", **source}})

    message = (
        "source.huggingFace.revision needs source.huggingFace.file: name the GGUF file to pin "
        "(e.g. file: model-Q4_K_M.gguf), or remove revision"
    )
    for good in (
        hf(),
        hf(file="m-Q4_K_M.gguf"),
        hf(file="m-Q4_K_M.gguf", revision="main"),
        hf(file="sub/m.gguf", revision="0123456789abcdef0123456789abcdef01234567"),
    ):
        assert errors(good) == [], good
    for bad in (hf(revision="main"), hf(revision="v1.0")):
        assert schema_errors(bad) == []  # structurally fine: the CEL rule is what refuses it
        assert cel_errors(bad) == [f".spec.source.huggingFace: {message}"]


def test_pvc_subpath_may_not_escape() -> None:
    bad = mp(source={"pvc": {"claimName": "c", "subPath": "a/../../etc/x"}})
    assert any("'..'" in e for e in errors(bad))


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"args": ["x"] * 65}, "too long"),
        ({"aliases": ["a" * 129]}, "too long"),
        ({"source": {"url": {"url": "ftp://x", "sha256": "a" * 64}}}, "does not match"),
        ({"source": {"url": {"url": "https://x"}}}, "'sha256' is a required property"),
        ({"source": {"localPath": {"path": "relative.gguf"}}}, "does not match"),
        ({"args": ["--chat-template", "a\nb"]}, "does not match"),
        ({"unknownField": 1}, "Additional properties"),
        ({"lifecycle": {"stopTimeout": -1}}, "minimum"),
    ],
)
def test_schema_bounds_and_patterns(spec: dict[str, Any], fragment: str) -> None:
    assert any(fragment in e for e in schema_errors(mp(**spec))), schema_errors(mp(**spec))


# --- the examples ---------------------------------------------------------------------------
def test_examples_exist_for_each_kind_of_source() -> None:
    kinds = {next(iter(yaml.safe_load(p.read_text())["spec"]["source"])) for p in EXAMPLES}
    assert kinds >= {"localPath", "huggingFace", "url"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_and_renders(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    assert obj["apiVersion"] == "corral.dev/v1alpha1" and obj["kind"] == "ModelPreset"
    assert errors(obj) == []
    assert (
        cel_errors(copy.deepcopy(obj), obj) == []
    )  # an unchanged update passes the transition rules
    r = render([obj], {"node-1": (obj["spec"].get("placement") or {}).get("nodeSelector") or {}})
    assert r.invalid == {} and list(r.node_sets) == ["node-1"]
