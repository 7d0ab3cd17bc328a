"""Issue 50 (security round 3), row 1: no client can cut another client's request.

``--max-child-errors`` restarts a child that answers requests in a row with 5xx of its own (a
wedged child, issue 28). b11434 also answers 500 to requests that are only the client's own
mistake, and a client with the key could send five of them and kill the child under another
client's stream (it ended at event 2,084 of 7,000 with "the model's server stopped
mid-response"), again and again. Only a child that fails the agent's own probe (a request
that any healthy child answers) is judged wedged now.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.harness import http, open_stream

KEY = "agent-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
# Requests b11434 answers with 500, whatever the state of the child (its source: an exception
# other than std::invalid_argument in a handler is ERROR_TYPE_SERVER).
BAD = [
    ("/detokenize", {"model": "demo-tiny", "tokens": [99999999]}),
    (
        "/v1/chat/completions",
        {
            "model": "demo-tiny",
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ],
                }
            ],
        },
    ),
]


def _child_pid(agent: Any) -> int:
    status, body = http("GET", agent.url + "/models", headers=AUTH)
    assert status == 200, body
    return int(next(m for m in body["data"] if m["id"] == "demo-tiny")["corral"]["pid"])


def test_a_clients_own_bad_requests_never_cut_another_clients_stream(
    start_agent: Any, demo_dir: Path
) -> None:
    agent = start_agent(
        "--models-dir", str(demo_dir), "--api-key", KEY, "--max-child-errors", "3", "-np", "4"
    )
    conn, stream = open_stream(agent, "demo-tiny", headers=AUTH)
    pid = _child_pid(agent)
    statuses = []
    for _ in range(4):  # 8 in a row: more than twice the limit
        for path, body in BAD:
            status, answer = http("POST", agent.url + path, body, headers=AUTH)
            statuses.append(status)
            assert status == 500, answer  # b11434's answer, passed on as it is
    events = 1  # open_stream read the first one
    done = False
    for line in stream:
        if line.startswith(b"data: "):
            if line.strip() == b"data: [DONE]":
                done = True
                break
            assert b'"error"' not in line, line
            events += 1
    conn.close()
    assert done and events >= 3000, (events, statuses)
    assert _child_pid(agent) == pid  # the same child served it all
    status, body = http("GET", agent.url + "/models", headers=AUTH)
    entry = next(m for m in body["data"] if m["id"] == "demo-tiny")
    assert entry["corral"]["error"] is None, json.dumps(entry)
    log = agent.log()
    assert "is wedged" not in log and "killing" not in log
    # The suspicion was probed on the real b11434, which answered as a healthy child does.
    assert "its child answered the probe: not wedged" in log, log[-3000:]
