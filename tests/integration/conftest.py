"""Fixtures for tests with the real agent and real llama-server children on demo models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent import demo_models as dm
from node_agent.demo_models import write_demo_models
from tests.integration.harness import AgentProcess, b11434_path, missing_in_ci_fails


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo models (tiny, small, medium), generated once per session.

    ``CORRAL_TEST_MODELS`` names a folder to keep them in between runs.
    """
    cached = os.environ.get("CORRAL_TEST_MODELS")
    folder = Path(cached) if cached else tmp_path_factory.mktemp("demo-models")
    write_demo_models(folder)
    return folder


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct from its wheel (hack/setup.sh installs it; CI always has it)."""
    from node_agent.real_model import HOW_TO_GET, real_model_path

    path = real_model_path()
    if path is None:
        missing_in_ci_fails(HOW_TO_GET)
    return path


@pytest.fixture(scope="session")
def b11434() -> Path:
    """llama-server b11434 built from source (`corral llama-server build`; hack/setup.sh
    builds it once per machine)."""
    path = b11434_path()
    if not os.access(path, os.X_OK):
        missing_in_ci_fails(f"llama-server b11434: {path} is missing (corral llama-server build)")
    return path


@pytest.fixture(scope="session")
def llama_server() -> str:
    from node_agent.llama_server.binary import find_llama_server

    return str(find_llama_server(None, os.environ))


@pytest.fixture
def start_agent() -> Iterator[Any]:
    agents: list[AgentProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> AgentProcess:
        agent = AgentProcess(args, env)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()
        leftover = agent.children()
        assert not leftover, f"children outlived the agent: {leftover}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only demo-tiny (1 MB), for tests that need no other."""
    model = next(m for m in dm.DEMO_MODELS if m.name == "demo-tiny")
    cache = os.environ.get("CORRAL_TEST_MODELS")
    folder = Path(cache) if cache else tmp_path_factory.mktemp("child-models")
    return dm.write_model(folder / model.file_name, model)
