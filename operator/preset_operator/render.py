"""Placement and rendering: (presets, agent nodes with labels) → the presets ConfigMap (pure).

Deterministic by construction — same inputs, byte-identical output — so the operator can compare
what it wants with what is stored and write nothing when they agree.

Each preset is stored once, as a one-section INI keyed by its content hash, and ``nodes.json``
lists for every node the files it reads, by their index in one sorted list of files. The size is
then the presets' own text plus about 35 bytes per node, however differently the nodes are
placed: measured (tests/unit/test_configmap_size.py) 5,000 nodes each with its own combination
of 5 out of 40 presets take 200 KB, where one INI per distinct node set took 5.2 MB.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from node_agent.sources.preset_ini import section_hashes

from .ini import render_ini, section_keys
from .presets import InvalidPreset, Preset, parse_preset

NODES_KEY = "nodes.json"


def file_key(ini_text: str) -> str:
    """The ConfigMap key of one preset's INI: its content hash (12 hex digits = 48 bits), so a
    changed preset is a new key and the kubelet's atomic swap never shows a half-updated one."""
    return f"preset-{hashlib.sha256(ini_text.encode()).hexdigest()[:12]}.ini"


def index_text(files: Iterable[str], node_files: Mapping[str, Iterable[str]]) -> str:
    """``nodes.json``: ``{"files": [sorted keys], "nodes": {node: [indices into files]}}``,
    one node a line (greppable, and a diff of one node's change is one line)."""
    keys = sorted(files)
    position = {key: i for i, key in enumerate(keys)}
    lines = [
        f"{json.dumps(node)}:{json.dumps([position[k] for k in node_files[node]])}"
        for node in sorted(node_files)
    ]
    nodes = "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"
    return f'{{"files":{json.dumps(keys)},\n"nodes":{nodes}}}\n'


@dataclass(frozen=True)
class Rendering:
    files: dict[str, str]  # file key → one preset's INI text
    node_sets: dict[str, tuple[str, ...]]  # node → the file keys it reads (by model name)
    matched: dict[str, tuple[str, ...]]  # preset name → agent nodes it selects (sorted)
    conflicts: dict[str, dict[str, str]]  # preset name → node → why it is not offered there
    invalid: dict[str, str]  # preset name → why it cannot be rendered at all
    presets: dict[str, Preset] = field(default_factory=dict)  # the valid ones, by name
    # preset name → its section's hash as an agent reads it (what a node that serves this
    # version reports); only for presets offered on some node
    hashes: dict[str, str] = field(default_factory=dict)

    def configmap_data(self) -> dict[str, str]:
        data = dict(self.files)
        data[NODES_KEY] = index_text(self.files, self.node_sets)
        return data

    def offered(self, preset: str) -> tuple[str, ...]:
        """Nodes whose file carries this preset (matched minus conflicts)."""
        bad = self.conflicts.get(preset, {})
        return tuple(n for n in self.matched.get(preset, ()) if n not in bad)


def parse_all(objects: Iterable[Mapping[str, Any]]) -> tuple[list[Preset], dict[str, str]]:
    """Parse ModelPreset objects; the invalid ones come back with their reason."""
    valid: list[Preset] = []
    invalid: dict[str, str] = {}
    for obj in objects:
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            preset = parse_preset(obj)
            section_keys(preset)  # refuses args that fight structured fields
        except InvalidPreset as exc:
            invalid[name] = str(exc)
            continue
        valid.append(preset)
    return valid, invalid


def render(
    objects: Iterable[Mapping[str, Any]],
    agent_nodes: Mapping[str, Mapping[str, str]],
) -> Rendering:
    """Place every valid preset on the agent nodes it selects; one file per preset, and the
    files of each node.

    ``agent_nodes`` maps each node that runs an agent to its labels. Two presets that claim one
    name (model name or alias) on the same node conflict there: the older one (creation time,
    then object name) keeps the name, the newer one is left out on that node and says why in its
    status — an agent would otherwise merge or refuse them, depending on order.
    """
    presets, invalid = parse_all(objects)
    presets.sort(key=lambda p: (p.created, p.name))
    matched: dict[str, list[str]] = {p.name: [] for p in presets}
    conflicts: dict[str, dict[str, str]] = {}
    per_node: dict[str, list[Preset]] = {}
    for node in sorted(agent_nodes):
        labels = agent_nodes[node]
        claimed: dict[str, str] = {}  # name or alias → preset that holds it on this node
        for preset in presets:
            if not preset.selects(labels):
                continue
            matched[preset.name].append(node)
            clash = next((n for n in preset.names if n in claimed), None)
            if clash is not None:
                conflicts.setdefault(preset.name, {})[node] = (
                    f"name {clash!r} is already served on this node by ModelPreset {claimed[clash]}"
                )
                continue
            for n in preset.names:
                claimed[n] = preset.name
            per_node.setdefault(node, []).append(preset)
    files: dict[str, str] = {}
    keys: dict[str, str] = {}  # preset name → its file key
    hashes: dict[str, str] = {}
    for preset in {p.name: p for chosen in per_node.values() for p in chosen}.values():
        text = render_ini([preset])
        keys[preset.name] = file_key(text)
        files[keys[preset.name]] = text
        hashes[preset.name] = section_hashes(text, keys[preset.name])[preset.model_name]
    node_sets = {
        node: tuple(keys[p.name] for p in sorted(chosen, key=lambda p: p.model_name))
        for node, chosen in per_node.items()
    }
    return Rendering(
        files=files,
        node_sets=node_sets,
        matched={name: tuple(nodes) for name, nodes in matched.items()},
        conflicts=conflicts,
        invalid=invalid,
        presets={p.name: p for p in presets},
        hashes=hashes,
    )


# The apiserver refuses a ConfigMap whose values add up to more than 1 MiB (ValidateConfigMap:
# the sum of len(value) over data and binaryData against MaxSecretSize).
CONFIGMAP_LIMIT = 1024 * 1024


def configmap_size(data: Mapping[str, str]) -> int:
    """What the apiserver checks against CONFIGMAP_LIMIT: the values' lengths, in bytes."""
    return sum(len(v.encode()) for v in data.values())


def configmap_patch(
    current: Mapping[str, str], desired: Mapping[str, str]
) -> dict[str, str | None]:
    """A merge patch of ConfigMap ``data`` turning ``current`` into ``desired`` ({} = no change).

    Keys of files no node reads any more are removed (``None``), in the same write as the new
    index, so the kubelet's atomic ``..data`` swap never shows an index naming a missing file.
    """
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in desired})
    return patch
