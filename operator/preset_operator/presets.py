"""ModelPreset objects as plain, validated values (no kopf, no I/O).

The CRD's schema and CEL rules are the first line of defence; this module checks again what the
renderer relies on, because a cluster may run the operator against an older copy of the CRD (or
one whose CEL rules its apiserver cannot enforce), and a bad value here would otherwise end up in
every selected node's preset file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from node_agent.errors import ConfigError
from node_agent.sources.options import llama_options
from node_agent.sources.preset_env import ENV_PREFIX, parse_env_entry
from node_agent.sources.trust import PATH_OPTIONS, arg_refusal
from node_agent.sources.trust import PVC_MOUNT_ROOT as PVC_MOUNT_ROOT  # the chart's claim mounts

# The agent's own llama-server option table (pure data: no agent runtime is imported). What
# args may set is the agent's allow-list (node_agent.sources.trust), the one the CRD's CEL rule
# lists too (hack/gen-crd-allowlist.py; tests/unit/test_crd_cel.py keeps them equal).
_TABLE = llama_options()

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTION = re.compile(r"^--?[A-Za-z][A-Za-z0-9_-]*$")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
_SHA256 = re.compile(r"^[a-f0-9]{64}$")


class InvalidPreset(ValueError):
    """A ModelPreset whose spec cannot be rendered; the message is shown in its status."""


@dataclass(frozen=True)
class LocalPathSource:
    path: str


@dataclass(frozen=True)
class HuggingFaceSource:
    repo: str
    file: str | None = None
    revision: str | None = None


@dataclass(frozen=True)
class UrlSource:
    url: str
    sha256: str


@dataclass(frozen=True)
class PvcSource:
    claim_name: str
    sub_path: str

    @property
    def path(self) -> str:
        return f"{PVC_MOUNT_ROOT}/{self.claim_name}/{self.sub_path}"


Source = LocalPathSource | HuggingFaceSource | UrlSource | PvcSource


@dataclass(frozen=True)
class Lifecycle:
    load_on_startup: bool | None = None
    stop_timeout: int | None = None
    ttl: int | None = None
    pin: bool | None = None
    priority: int | None = None


@dataclass(frozen=True)
class Preset:
    """One ModelPreset, reduced to what placement, rendering and status need."""

    name: str  # metadata.name
    model_name: str  # spec.modelName, else metadata.name
    source: Source
    options: tuple[tuple[str, str], ...] = ()  # spec.args as (INI key, value), in given order
    aliases: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # spec.env, sorted by name
    node_selector: tuple[tuple[str, str], ...] = ()  # sorted
    lifecycle: Lifecycle = Lifecycle()
    uid: str = ""
    generation: int = 0
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text)

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels gets this model (all selector labels must match)."""
        return all(labels.get(key) == value for key, value in self.node_selector)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a client may use for this model on a node."""
        return (self.model_name, *self.aliases)


def parse_args(args: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Command-line style llama-server options → INI (key, value) pairs.

    ``--ctx-size 4096`` and ``--ctx-size=4096`` give ``ctx-size = 4096``; a bare flag gives
    ``flag = true`` (``--no-repack`` stays ``no-repack = true``: the agent reads ``no-x = true`` as
    ``x = false``, like llama.cpp). A token is an option only when a letter follows its dashes,
    so negative numbers (``--n-gpu-layers -1``) are values.
    """
    options: list[tuple[str, str]] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        token = args[i]
        if any(c in token for c in "\r\n"):
            raise InvalidPreset(f"args[{i}] contains a line break")
        head, eq, inline = token.partition("=")
        if not _OPTION.match(head):
            raise InvalidPreset(f"args[{i}] = {token!r} is not an option (expected --name or -n)")
        match = _TABLE.flag(head)
        if match is None:
            close = _TABLE.suggest_flag(head)
            hint = f" (did you mean {close}?)" if close else ""
            raise InvalidPreset(f"args[{i}] = {head} is not a llama-server option{hint}")
        option = match.option
        refusal = arg_refusal(option.name)
        if refusal is not None:
            raise InvalidPreset(f"args may not set {head}: {refusal}")
        if eq:
            value = inline
        elif not option.is_flag and i + 1 < len(args):
            i += 1
            value = args[i]
            if any(c in value for c in "\r\n"):
                raise InvalidPreset(f"args[{i}] contains a line break")
        elif option.is_flag:
            value = "true"
        else:
            raise InvalidPreset(f"args: {head} needs a value")
        # Checked here, with the agent's own table: a value the agent would refuse would make
        # it refuse the whole node's preset file, every other model's with it.
        problem = None if option.is_flag else option.check(value.strip())
        if problem is not None:
            raise InvalidPreset(f"args: {head} expects {problem}, got {value!r}")
        if option.name in PATH_OPTIONS and (not value.startswith("/") or ".." in value.split("/")):
            # The agent checks where it lands (inside its models dir, caches or PVC mounts).
            raise InvalidPreset(f"args: {head} must be an absolute path without '..'")
        key = head.lstrip("-")
        if key in seen:
            # An INI section holds a key once; silently keeping one of two would surprise.
            raise InvalidPreset(f"args set {head} twice")
        seen.add(key)
        options.append((key, value.strip()))
        i += 1
    return tuple(options)


def parse_env(env: Any) -> tuple[tuple[str, str], ...]:
    """``spec.env`` → sorted (name, value) pairs, held to the agent's own allow-list
    (``node_agent.sources.preset_env``: device and memory variables, device-list values)."""
    if not isinstance(env, Mapping):
        raise InvalidPreset("spec.env must be a map of variable names to strings")
    pairs = []
    for name, value in sorted(env.items()):
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidPreset("spec.env must be a map of variable names to strings")
        try:
            pairs.append(parse_env_entry(ENV_PREFIX + name, value, "spec.env"))
        except ConfigError as exc:
            raise InvalidPreset(str(exc)) from None
    return tuple(pairs)


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidPreset(f"{where}.{key} must be a non-empty string")
    if _CONTROL.search(value):
        # The CRD's patterns refuse line breaks too; an operator run against an older CRD must
        # not write them into an INI.
        raise InvalidPreset(f"{where}.{key} contains a line break or control character")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    return _str(obj, key, where) if obj.get(key) is not None else None


def parse_source(source: Mapping[str, Any]) -> Source:
    kinds = [k for k in ("huggingFace", "url", "localPath", "pvc") if source.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidPreset(
            "exactly one of source.huggingFace, source.url, source.localPath, source.pvc "
            f"must be set (found {len(kinds)})"
        )
    kind = kinds[0]
    body = source[kind]
    if not isinstance(body, Mapping):
        raise InvalidPreset(f"source.{kind} must be an object")
    where = f"spec.source.{kind}"
    if kind == "localPath":
        path = _str(body, "path", where)
        if not path.startswith("/"):
            raise InvalidPreset(f"{where}.path must be absolute")
        return LocalPathSource(path)
    if kind == "huggingFace":
        return HuggingFaceSource(
            _str(body, "repo", where),
            _opt_str(body, "file", where),
            _opt_str(body, "revision", where),
        )
    if kind == "url":
        url, sha = _str(body, "url", where), _str(body, "sha256", where)
        if not url.startswith(("http://", "https://")):
            raise InvalidPreset(f"{where}.url must be an http(s) URL")
        if not _SHA256.match(sha):
            raise InvalidPreset(f"{where}.sha256 must be 64 lower-case hex digits")
        return UrlSource(url, sha)
    sub = _str(body, "subPath", where)
    if sub.startswith("/") or ".." in sub.split("/"):
        raise InvalidPreset(f"{where}.subPath must be relative and may not contain '..'")
    return PvcSource(_str(body, "claimName", where), sub)


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidPreset(f"spec.lifecycle.{key} must be an integer")
    return value


def _opt_bool(obj: Mapping[str, Any], key: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidPreset(f"spec.lifecycle.{key} must be a boolean")
    return value


def parse_preset(obj: Mapping[str, Any]) -> Preset:
    """A ModelPreset object (as the API returns it) → Preset; raises InvalidPreset."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = str(meta.get("name", ""))
    model_name = spec.get("modelName") or name
    if not isinstance(model_name, str) or not _MODEL_NAME.match(model_name):
        raise InvalidPreset(f"model name {model_name!r} is not valid")
    source = spec.get("source")
    if not isinstance(source, Mapping):
        raise InvalidPreset("spec.source is required")
    raw_args = spec.get("args") or []
    if not isinstance(raw_args, list) or not all(isinstance(a, str) for a in raw_args):
        raise InvalidPreset("spec.args must be a list of strings")
    aliases = spec.get("aliases") or []
    if not isinstance(aliases, list) or not all(
        isinstance(a, str) and _MODEL_NAME.match(a) for a in aliases
    ):
        raise InvalidPreset("spec.aliases must be a list of valid model names")
    if len(set(aliases)) != len(aliases):
        raise InvalidPreset("spec.aliases must be unique")
    if model_name in aliases:
        raise InvalidPreset("spec.aliases may not contain the model name itself")
    selector = ((spec.get("placement") or {}).get("nodeSelector")) or {}
    if not isinstance(selector, Mapping):
        raise InvalidPreset("spec.placement.nodeSelector must be a map of labels")
    life = spec.get("lifecycle") or {}
    return Preset(
        name=name,
        model_name=model_name,
        source=parse_source(source),
        options=parse_args(raw_args),
        aliases=tuple(aliases),
        env=parse_env(spec.get("env") or {}),
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        lifecycle=Lifecycle(
            load_on_startup=_opt_bool(life, "loadOnStartup"),
            stop_timeout=_opt_int(life, "stopTimeout"),
            ttl=_opt_int(life, "ttl"),
            pin=_opt_bool(life, "pin"),
            priority=_opt_int(life, "priority"),
        ),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        created=str(meta.get("creationTimestamp", "")),
    )
