"""Issue 16 rows 1, 2 and 4 against a real agent: the operator's ConfigMap is restricted, and one
bad preset is refused alone while the node serves the others (acceptance 16.2, second half).

The bad files are what an operator without the allow-list rendered (today's main did): an MCP
server that runs a shell, a template file that reads the child's environment, and a chat
template of ``#`` written unquoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.harness import chat
from tests.kubelet import write_configmap_volume


def test_one_bad_preset_never_takes_the_node_down(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "owned"
    mcp = json.dumps(
        {"mcpServers": {"x": {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]}}}
    )
    model = demo_dir / "demo-tiny.gguf"
    files = {
        "preset-good.ini": f"[good]\nmodel = {model}\nctx-size = 256\n",
        "preset-mcp.ini": (
            f"[mcp]\nmodel = {model}\nload-on-startup = true\nmcp-servers-json = {mcp}\n"
        ),
        "preset-environ.ini": (
            f"[environ]\nmodel = {model}\nchat-template-file = /proc/self/environ\n"
        ),
        "preset-hash.ini": f"[hash]\nmodel = {model}\nchat-template = #\n",
    }
    names = sorted(files)
    files["nodes.json"] = json.dumps({"files": names, "nodes": {"node-a": list(range(len(names)))}})
    volume = tmp_path / "presets"
    volume.mkdir()
    write_configmap_volume(volume, files, "v1")

    agent = start_agent("--models-preset", str(volume), env={"NODE_NAME": "node-a"})
    status, body = agent.get("/models")
    assert status == 200, body
    assert [m["id"] for m in body["data"]] == ["good"]
    refused = {tuple(r["models"]): r for r in body["refused"]}
    assert set(refused) == {("mcp",), ("environ",), ("hash",)}
    assert refused[("mcp",)]["origin"].endswith("preset-mcp.ini:4")
    assert "mcp-servers-json" in refused[("mcp",)]["reason"]
    assert "chat-template-file" in refused[("environ",)]["reason"]
    assert "needs a value" in refused[("hash",)]["reason"]  # '#' starts a comment: empty
    assert "preset refused (it cannot be applied; the others stay)" in agent.log()

    assert agent.post("/v1/chat/completions", chat("good"))[0] == 200
    assert agent.post("/models/load", {"model": "mcp"})[0] == 404
    assert not marker.exists()
