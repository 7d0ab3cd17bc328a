"""``--models-dir``: GGUF files and model folders (llama.cpp's ``load_from_models_dir``).

* A top-level ``x.gguf`` is model ``x`` — every one, as llama.cpp lists them (shards and
  ``mmproj`` files at the top level included: put multi-file models in a folder).
* A folder is one model named after the folder: its first shard (``-00001-of-``) or else its
  ``.gguf``; a file whose name contains ``mmproj`` becomes ``--mmproj``. A folder with no
  model file is skipped. Only one level deep; hidden entries count, as in llama.cpp.

Nothing is opened: listing 1,000 files costs a few ``scandir`` calls. Paths are joined to the
directory as given (relative stays relative), which is what llama.cpp passes to its children.
Where llama.cpp depends on directory order (a folder with several plain ``.gguf`` files),
Corral picks the first by name so that the result is stable.
"""

from __future__ import annotations

import os

from node_agent.errors import ConfigError
from node_agent.sources.spec import SOURCE_MODELS_DIR, ModelSpec

GGUF = ".gguf"  # case-sensitive, as llama.cpp's string_ends_with
FIRST_SHARD = "-00001-of-"


def scan_models_dir(models_dir: str) -> list[ModelSpec]:
    """The models in ``models_dir``, sorted by name."""
    if not os.path.isdir(models_dir):
        raise ConfigError(f"--models-dir {models_dir!r} does not exist or is not a directory")
    try:
        entries = sorted(os.scandir(models_dir), key=lambda e: e.name)
    except OSError as e:
        raise ConfigError(f"--models-dir {models_dir!r} cannot be read: {e.strerror}") from e
    specs: list[ModelSpec] = []
    for entry in entries:
        path = os.path.join(models_dir, entry.name)
        if entry.is_dir():  # follows symlinks, like std::filesystem::is_directory
            spec = _scan_folder(path, entry.name)
            if spec is not None:
                specs.append(spec)
        elif entry.name.endswith(GGUF) and entry.is_file():
            # llama.cpp removes every ".gguf" from the name (string_replace_all).
            name = entry.name.replace(GGUF, "")
            specs.append(ModelSpec(name=name, source=SOURCE_MODELS_DIR, options=(("model", path),)))
    return specs


def _scan_folder(folder: str, name: str) -> ModelSpec | None:
    try:
        files = sorted(e.name for e in os.scandir(folder) if e.is_file() and e.name.endswith(GGUF))
    except OSError:
        # An unreadable folder holds no model we could start; llama.cpp skips it too.
        return None
    model = first_shard = mmproj = None
    for file in files:
        if "mmproj" in file:
            mmproj = mmproj or file
        elif FIRST_SHARD in file:
            first_shard = first_shard or file
        else:
            model = model or file
    chosen = first_shard or model
    if chosen is None:
        return None
    options: list[tuple[str, str | bool]] = [("model", os.path.join(folder, chosen))]
    if mmproj is not None:
        options.append(("mmproj", os.path.join(folder, mmproj)))
    return ModelSpec(name=name, source=SOURCE_MODELS_DIR, options=tuple(options))
