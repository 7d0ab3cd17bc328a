"""The README's client examples, run as written (their port aside) against a real agent that
serves the real model: the openai SDK's and the ollama client's, each in a Python of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.real_model import MODEL_NAME
from tests import readme
from tests.integration.harness import AgentProcess

BLOCKS = readme.blocks("python")


@pytest.fixture(scope="module")
def agent(real_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    folder = tmp_path_factory.mktemp("readme-clients")
    os.link(real_model, folder / f"{MODEL_NAME}.gguf")
    agent = AgentProcess(["--models-dir", str(folder), "-c", "2048"])
    yield agent
    agent.stop()


@pytest.mark.parametrize("block", BLOCKS, ids=["openai", "ollama"])
def test_the_readmes_client_example_gets_the_real_models_answer(
    agent: AgentProcess, block: str
) -> None:
    assert "localhost:8080" in block and MODEL_NAME in block
    code = block.replace("localhost:8080", f"127.0.0.1:{agent.port}")
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout, run.stdout
