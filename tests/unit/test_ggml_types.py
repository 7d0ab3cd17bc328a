"""The header reader's table of ggml types is gguf-py's (which it no longer imports)."""

from __future__ import annotations

import subprocess
import sys

from gguf.constants import GGML_QUANT_SIZES, LlamaFileType

from node_agent.memory.ggml_types import BLOCKS, FILE_TYPES


def test_the_tables_are_gguf_pys() -> None:
    assert {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()} == dict(BLOCKS)
    assert {int(t): t.name.removeprefix("MOSTLY_") for t in LlamaFileType} == dict(FILE_TYPES)


def test_reading_a_header_and_its_quantization_imports_neither_gguf_nor_numpy() -> None:
    code = (
        "import sys; from node_agent.memory.gguf_header import read_header; "
        "from node_agent.ollama.listing import _file_type; _file_type(3); "
        "print(sorted(m for m in ('gguf', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
