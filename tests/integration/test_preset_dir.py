"""The agent reads its node's presets from the operator's ConfigMap volume and follows it.

The volume is laid out as the kubelet lays it out: a timestamped folder with the files, a
``..data`` symlink to it, and visible names that are symlinks through ``..data``; an update
writes a new folder and renames a new ``..data`` link over the old one (atomic).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import chat, wait_until


class ConfigMapVolume:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self.version = 0

    def write(self, files: dict[str, str]) -> None:
        """Publish a new version of the ConfigMap's data, atomically."""
        self.version += 1
        folder = self.root / f"..2026_11_30_00_00_{self.version:02d}.000000"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(folder.name)
        os.rename(tmp, self.root / "..data")  # the kubelet's atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def node_files(demo_dir: Path, tiny_ctx: int) -> dict[str, str]:
    ini = (
        f"[chat]\nmodel = {demo_dir / 'demo-tiny.gguf'}\nctx-size = {tiny_ctx}\n\n"
        f"[steady]\nmodel = {demo_dir / 'demo-small.gguf'}\nctx-size = 512\n"
    )
    other = f"[elsewhere]\nmodel = {demo_dir / 'demo-medium.gguf'}\n"
    return {
        "set-aaaa.ini": ini,
        "set-bbbb.ini": other,
        "nodes.json": json.dumps({"node-a": "set-aaaa.ini", "node-b": "set-bbbb.ini"}),
    }


def test_agent_follows_the_data_swap_and_restarts_only_the_changed_model(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    volume = ConfigMapVolume(tmp_path / "presets")
    volume.write(node_files(demo_dir, 512))
    agent = start_agent("--models-preset", str(volume.root), env={"NODE_NAME": "node-a"})
    assert set(agent.models()) == {"chat", "steady"}  # node-a's set only
    for model in ("chat", "steady"):
        assert agent.post("/v1/chat/completions", chat(model))[0] == 200
    pids = {name: agent.models()[name]["corral"]["pid"] for name in ("chat", "steady")}

    volume.write(node_files(demo_dir, 1024))  # only chat's arguments change
    deadline = time.monotonic() + 15
    while True:
        chat_entry = agent.models()["chat"]
        args = chat_entry["status"]["args"]
        if args[args.index("--ctx-size") + 1] == "1024":
            break
        assert time.monotonic() < deadline, "the agent did not pick up the swap"
        time.sleep(0.1)
    agent.wait_state("chat", "unloaded")
    steady = agent.models()["steady"]
    assert steady["status"]["value"] == "loaded"
    assert steady["corral"]["pid"] == pids["steady"]
    status, reply = agent.post("/v1/chat/completions", chat("chat"))
    assert status == 200, reply
    assert agent.models()["chat"]["corral"]["pid"] != pids["chat"]


def test_a_broken_update_keeps_the_running_presets(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    volume = ConfigMapVolume(tmp_path / "presets")
    volume.write(node_files(demo_dir, 512))
    agent = start_agent("--models-preset", str(volume.root), env={"NODE_NAME": "node-a"})
    broken = node_files(demo_dir, 512)
    broken["set-aaaa.ini"] += "no-such-option = 1\n"
    volume.write(broken)
    deadline = time.monotonic() + 10
    while "cannot be applied" not in agent.log():
        assert time.monotonic() < deadline, agent.log()
        time.sleep(0.1)
    assert "no-such-option" in agent.log()
    # Logged as the sources are read (off the loop); the catalog is kept a moment later.
    wait_until(lambda: agent.get("/models")[1].get("refused"), "the refusal in GET /models", 10)
    assert set(agent.models()) == {"chat", "steady"}  # as they were before the bad update
    assert agent.get("/models")[1]["refused"][0]["models"] == ["chat", "steady"]
    assert agent.post("/v1/chat/completions", chat("chat"))[0] == 200
