"""Issue 26, rows 9 and 10, against a real agent: an operator preset that clashes with the
node's own models is refused alone and never merges over them.

Row 9: a ModelPreset alias equal to a models-dir model's name stopped the agent from starting
(and made every later preset update fail). Row 10: a ModelPreset named like a models-dir model
replaced that model's file and options, silently.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.integration.harness import AgentProcess, chat
from tests.kubelet import write_configmap_volume

Start = Callable[..., AgentProcess]


def test_row9_row10_a_clashing_operator_preset_is_refused_alone(
    start_agent: Start, demo_dir: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(demo_dir / "demo-tiny.gguf", models / "local.gguf")
    shutil.copyfile(demo_dir / "demo-tiny.gguf", models / "other.gguf")
    other = models / "other.gguf"
    files = {
        "preset-good.ini": f"[good]\nmodel = {other}\n",
        "preset-alias.ini": f"[taker]\nmodel = {other}\nalias = local\n",
        "preset-name.ini": f"[local]\nmodel = {other}\nctx-size = 256\n",
    }
    names = sorted(files)
    files["nodes.json"] = json.dumps({"files": names, "nodes": {"node-a": [0, 1, 2]}})
    volume = tmp_path / "presets"
    volume.mkdir()
    write_configmap_volume(volume, files, "v1")

    agent = start_agent(
        "--models-dir", str(models), "--models-preset", str(volume), env={"NODE_NAME": "node-a"}
    )
    status, body = agent.get("/models")
    assert status == 200, body
    entries = {m["id"]: m for m in body["data"]}
    assert sorted(entries) == ["good", "local", "other"]
    local = entries["local"]
    assert local["source"] == "models_dir"
    assert str(models / "local.gguf") in local["status"]["args"]  # its own file, untouched
    assert "256" not in local["status"]["args"]
    refused = {tuple(r["models"]): r["reason"] for r in body["refused"]}
    assert set(refused) == {("taker",), ("local",)}
    assert "alias 'local'" in refused[("taker",)]
    assert "already has a model of that name" in refused[("local",)]
    assert agent.post("/v1/chat/completions", chat("local"))[0] == 200
    assert agent.post("/v1/chat/completions", chat("good"))[0] == 200
