"""Issue 16 row 12: the agent is the only way into a child.

A child listens on 127.0.0.1, where every local user can reach it. With the agent's
``--api-key`` the children used to have none (any local user bypassed the key), and with
``LLAMA_API_KEY`` in the agent's environment they inherited the agent's (two behaviours). Now
each child has its own random key that only the agent knows, whichever way the agent got its
key, and the proxy sends it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import chat, http

KEY = "agent-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def child_port(agent: Any, model: str) -> int:
    status, body = http("GET", agent.url + "/models", headers=AUTH)
    assert status == 200, body
    entry = next(m for m in body["data"] if m["id"] == model)
    argv = entry["status"]["args"]
    return int(argv[argv.index("--port") + 1])


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_child_answers_only_the_agent(start_agent: Any, demo_dir: Path, how: str) -> None:
    if how == "flag":
        agent = start_agent("--models-dir", str(demo_dir), "--api-key", KEY)
    else:
        agent = start_agent("--models-dir", str(demo_dir), env={"LLAMA_API_KEY": KEY})
    status, body = http("POST", agent.url + "/v1/chat/completions", chat("demo-tiny"), headers=AUTH)
    assert status == 200, body
    port = child_port(agent, "demo-tiny")
    direct = f"http://127.0.0.1:{port}/v1/chat/completions"
    assert http("POST", direct, chat("demo-tiny"))[0] == 401  # no key
    assert http("POST", direct, chat("demo-tiny"), headers=AUTH)[0] == 401  # the agent's key
    assert http("GET", f"http://127.0.0.1:{port}/health")[0] == 200  # open, as in llama.cpp
    # ... and through the agent it still works, with the agent's key only; the child's
    # environment holds its own key, not the agent's.
    models = http("GET", agent.url + "/models", headers=AUTH)[1]["data"]
    child_pid = next(m for m in models if m["id"] == "demo-tiny")["corral"]["pid"]
    environ = Path(f"/proc/{child_pid}/environ").read_bytes().split(b"\0")
    keys = [e for e in environ if e.startswith(b"LLAMA_API_KEY=")]
    assert len(keys) == 1 and KEY.encode() not in keys[0]
    assert http("GET", agent.url + "/props?model=demo-tiny", headers=AUTH)[0] == 200
    assert http("GET", agent.url + "/props?model=demo-tiny")[0] == 401
