"""``--fit`` honesty: a child without a pinned ``-c`` sizes its context itself, and the ledger
holds what it took.

llama-server's ``--fit on`` (its default) sizes the context to the device as llama.cpp sees
it: on the CPU all of the RAM, free or not, never Corral's ``--memory-limit``. So each child
here takes its trained context (8192), twice the ``min`` the ledger admitted it on. Its smaps
reading at ready is smaller still (pages fill lazily: the compute buffer is touched by the
first full batch), so the ledger must hold the estimate at the context the child chose.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node_agent.memory.estimator import estimate
from tests.arch_models import ARCH_MODELS, write_arch_model
from tests.integration.harness import chat

MIB = 1 << 20


@pytest.fixture
def fit_models(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    for model in ARCH_MODELS:
        if model.arch in ("qwen3", "qwen3moe", "gemma3"):  # trained on 8192 tokens
            write_arch_model(folder / model.file_name, model)
    return folder


def test_the_ledger_holds_what_a_fit_child_took(start_agent: Any, fit_models: Path) -> None:
    agent = start_agent(
        "--models-dir", str(fit_models), "--models-memory-margin", "0",
        "--memory-limit", "host=1GiB",
    )  # fmt: skip
    rows = []
    for path in sorted(fit_models.glob("*.gguf")):
        assert agent.post("/v1/chat/completions", chat(path.stem))[0] == 200
        info = agent.models()[path.stem]
        chosen = int(info["meta"]["n_ctx"])
        memory = info["corral"]["memory"]
        took = estimate(path, {"c": str(chosen)}, ["host"]).devices["host"].total
        rows.append((path.stem, memory, chosen, took))
        assert chosen == int(info["meta"]["n_ctx_train"])  # --fit kept the trained context
        assert memory["min"]["host"] < took  # admitted on the --fit-ctx floor
        assert memory["held"]["host"] >= took  # held: what it took, not min
    print()
    print("| model | min MiB | chosen ctx | effective MiB | held MiB | estimate at chosen MiB |")
    print("|---|---|---|---|---|---|")
    for name, memory, chosen, took in rows:
        print(
            f"| {name} | {memory['min']['host'] / MIB:.2f} | {chosen}"
            f" | {memory['effective']['host'] / MIB:.2f} | {memory['held']['host'] / MIB:.2f}"
            f" | {took / MIB:.2f} |"
        )
