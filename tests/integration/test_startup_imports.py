"""The agent's start-up path imports nothing it can do without (issue 13: agent start with
1,000 models, bench S6). Not a timed test: it checks *what* is imported, which does not
depend on how busy the machine is.

gguf (and numpy with it) is for the memory ledger's estimates, pydantic for ``GET /models``
and the operator's client, prometheus_client for ``/metrics``, the ledger itself only with
its flags: each is imported where it is first needed (or in the background once the agent
listens), never before the agent answers ``/health``. (In tests/integration: it starts an
interpreter.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import AgentProcess, chat

# Modules an agent with default flags must not have imported when it starts listening.
NOT_AT_START = (
    "numpy",
    "gguf",
    "pydantic",
    "prometheus_client",
    "kopf",
    "yaml",
    "node_agent.models_schema",
    "node_agent.api.metrics_families",
    "node_agent.memory.estimator",
    "node_agent.memory.shape",
    "node_agent.memory.gguf_header",
    # the ledger: only with --models-memory-margin or --memory-limit
    "node_agent.runtime.memory_watch",
    "node_agent.tools.toolbox",  # the built-in tools: only with --tools or --agent
    "node_agent.api.peer_discovery",  # only with --peers-from-service
    "node_agent.core.endpoint_slices",
)

# What `corral agent` imports before it serves: the entry point, the agent and the app.
PROBE = """
import json, sys
import node_agent.cli, node_agent.agent, node_agent.api.app
print(json.dumps(sorted(sys.modules)))
"""


def test_start_up_imports_no_heavy_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(done.stdout))
    assert "aiohttp.web" in loaded  # the probe did import the start-up path
    assert [m for m in NOT_AT_START if m in loaded] == []


def test_an_agent_that_serves_loads_neither_numpy_nor_pydantic(demo_dir: Path) -> None:
    """What holds the agent's memory is mostly code (issue 49: RSS 10 MiB the interpreter,
    5 ssl, 4 asyncio, 15 aiohttp with its SSL contexts, 7 the agent's own; then gguf with
    numpy 16 and pydantic 8, measured). Neither of the last two is needed without the memory
    ledger, downloads or refused presets: not even once the agent has listed its models,
    checked their files, loaded one and answered (their shared libraries stay unmapped)."""
    agent = AgentProcess(["--models-dir", str(demo_dir), "-c", "512"])
    try:
        assert agent.get("/models")[0] == 200
        assert agent.post("/v1/chat/completions", chat("demo-tiny", 2))[0] == 200
        assert agent.get("/api/ps")[0] == 200
        assert agent.post("/api/show", {"model": "demo-tiny"})[0] == 200
        maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        heavy = sorted({m for m in ("numpy", "pydantic_core") if f"/{m}/" in maps})
        assert heavy == [], heavy
    finally:
        agent.stop()
