"""Which preset files a node's agent reads from the operator's ConfigMap mounted as a directory.

The corral operator writes one ConfigMap: ``preset-<hash>.ini`` files (one preset each) and
``nodes.json``, ``{"files": [file names], "nodes": {node name: [indices into files]}}`` (an
older operator wrote one ``set-<hash>.ini`` per node set and mapped node → file name; that
index is still read). The agent pod mounts it whole (no subPath, so updates arrive) and runs
``corral agent --models-preset /etc/corral/presets`` with ``NODE_NAME`` from the downward API;
this module picks that node's files.

The kubelet updates such a volume by writing a new timestamped directory and atomically
renaming the ``..data`` symlink; the visible names are symlinks through ``..data``. Reading
``nodes.json`` and then the files through those names could straddle a swap (old index, new
files without the old ones). Both are read from one resolved ``..data`` target instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from node_agent.errors import ConfigError
from node_agent.sources.trust import PVC_MOUNT_ROOT, Restricted

NODES_INDEX = "nodes.json"


def resolve_preset_files(directory: Path, node_name: str | None) -> list[Path]:
    """The INI files for ``node_name`` inside ``directory`` (none when no preset selects it).

    Raises ConfigError (naming the file) when the directory is not a presets ConfigMap, the node
    name is missing, the index is malformed, or it names a file that is not there.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(
            "not a directory (expected the mounted presets ConfigMap)", path=str(directory)
        )
    data = directory / "..data"
    kubelet_volume = data.is_symlink() or data.is_dir()
    base = data.resolve() if kubelet_volume else directory
    index = base / NODES_INDEX
    if kubelet_volume and not index.is_file() and not any(base.iterdir()):
        # The chart creates the ConfigMap without data (the operator owns it, and a rendered
        # placeholder would reset it on every upgrade): until the operator's first write, the
        # node has no presets. A plain folder without the index stays an error below.
        return []
    if not index.is_file():
        raise ConfigError(
            f"no {NODES_INDEX} here: --models-preset DIR must be the corral operator's presets "
            "ConfigMap (pass a file for a hand-written preset INI)",
            path=str(directory),
        )
    if not node_name:
        raise ConfigError(
            "NODE_NAME is not set: the agent cannot tell which node's presets to use "
            "(set it from the downward API: fieldRef spec.nodeName)",
            path=str(index),
        )
    try:
        mapping = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the node index: {exc}", path=str(index)) from exc
    names = _node_files(mapping, node_name, str(index))
    for name in names:
        if "/" in name or name.startswith("."):
            raise ConfigError(
                f"node {node_name!r} maps to {name!r}, not a file name", path=str(index)
            )
        if not (base / name).is_file():
            raise ConfigError(
                f"node {node_name!r} maps to {name!r}, which is not in the ConfigMap",
                path=str(index),
            )
    return [base / name for name in names]


def _node_files(mapping: object, node_name: str, where: str) -> list[str]:
    if isinstance(mapping, dict) and isinstance(mapping.get("nodes"), dict):
        files, nodes = mapping.get("files"), mapping["nodes"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ConfigError("the node index's 'files' must be a list of file names", path=where)
        chosen = nodes.get(node_name, [])
        if not isinstance(chosen, list) or not all(
            type(i) is int and 0 <= i < len(files) for i in chosen
        ):
            raise ConfigError(
                f"node {node_name!r} must map to a list of indices into 'files' "
                f"(0..{len(files) - 1}), not {chosen!r}",
                path=where,
            )
        return [files[i] for i in chosen]
    # The older index: node → one set file.
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise ConfigError("the node index must map node names to file names", path=where)
    key: str | None = mapping.get(node_name)
    return [key] if key is not None else []


def preset_files(models_preset: str | None, node_name: str | None) -> list[Path]:
    """The INI files ``--models-preset`` stands for: the file itself, or this node's files
    from the operator's mounted ConfigMap when it names a directory (none if the node has no
    presets)."""
    if not models_preset:
        return []
    path = Path(models_preset)
    if path.is_dir():
        return resolve_preset_files(path, node_name)
    return [path]


def preset_policy(
    models_preset: str | None, roots: Iterable[str | Path | None]
) -> Restricted | None:
    """How far this agent trusts its ``--models-preset``: a FILE is the administrator's own
    (None: every option), a DIRECTORY is the operator's ConfigMap, rendered from ModelPresets
    that other people wrote (restricted to the allow-list, file options inside ``roots`` and
    the PVC mount root)."""
    if not models_preset or not Path(models_preset).is_dir():
        return None
    return Restricted.under([*roots, PVC_MOUNT_ROOT])


def directory_version(directory: Path) -> object:
    """What changes when the kubelet swaps a ConfigMap volume (or someone edits its files).

    The ``..data`` symlink's target names the version; a plain directory (tests, hand-made
    set-ups) is versioned by its files' names, sizes and modification times.
    """
    data = directory / "..data"
    try:
        if data.is_symlink():
            return ("..data", str(data.readlink()))
        return tuple(
            sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir())
        )
    except OSError as exc:  # a swap in progress, or the volume went away: try again later
        return ("error", str(exc))
