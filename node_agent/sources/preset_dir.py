"""Which preset file a node's agent reads from the operator's ConfigMap mounted as a directory.

The corral operator writes one ConfigMap: ``set-<hash>.ini`` files (one per distinct preset set)
and ``nodes.json`` mapping node name → file name. The agent pod mounts it whole (no subPath, so
updates arrive) and runs ``corral agent --models-preset /etc/corral/presets`` with ``NODE_NAME``
from the downward API; this module picks that node's file.

The kubelet updates such a volume by writing a new timestamped directory and atomically
renaming the ``..data`` symlink; the visible names are symlinks through ``..data``. Reading
``nodes.json`` and then the set file through those names could straddle a swap (old index, new
files without the old set). Both are read from one resolved ``..data`` target instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from node_agent.errors import ConfigError

NODES_INDEX = "nodes.json"


def resolve_preset_file(directory: Path, node_name: str | None) -> Path | None:
    """The INI for ``node_name`` inside ``directory``, or None when the node has no presets.

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
        return None
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
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
    ):
        raise ConfigError("the node index must map node names to file names", path=str(index))
    key: str | None = mapping.get(node_name)
    if key is None:
        return None  # no ModelPreset selects this node
    if "/" in key or key.startswith("."):
        raise ConfigError(f"node {node_name!r} maps to {key!r}, not a file name", path=str(index))
    target = base / key
    if not target.is_file():
        raise ConfigError(
            f"node {node_name!r} maps to {key!r}, which is not in the ConfigMap", path=str(index)
        )
    return target


def preset_files(models_preset: str | None, node_name: str | None) -> list[Path]:
    """The INI files ``--models-preset`` stands for: the file itself, or this node's file
    from the operator's mounted ConfigMap when it names a directory (none if the node has no
    presets)."""
    if not models_preset:
        return []
    path = Path(models_preset)
    if path.is_dir():
        chosen = resolve_preset_file(path, node_name)
        return [chosen] if chosen is not None else []
    return [path]


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
