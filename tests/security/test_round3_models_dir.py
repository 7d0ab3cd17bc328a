"""Issue 50 (security round 3), row 2: one entry of ``--models-dir`` never kills hot reload.

A self-looping link (``ln -s self.gguf self.gguf``) made the folder's watcher task die with
``OSError: [Errno 40] Too many levels of symbolic links``; ``GET /models?reload=1`` answered
500, and files added later were never listed. A link to ``/etc/passwd`` named ``x.gguf`` was
listed, and llama-server started on it; a link to the folder itself was listed as a model.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import http


def test_links_that_loop_or_lead_out_never_stop_the_watch(
    start_agent: Any, demo_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(demo_dir / "demo-tiny.gguf", folder)
    agent = start_agent("--models-dir", str(folder), "-c", "512")
    (folder / "self.gguf").symlink_to("self.gguf")
    (folder / "passwd.gguf").symlink_to("/etc/passwd")
    (folder / "here").symlink_to(folder)
    status, body = http("GET", agent.url + "/models?reload=1")
    assert status == 200, body
    assert sorted(m["id"] for m in body["data"]) == ["demo-tiny"]
    skipped = {Path(r["origin"]).name: r["reason"] for r in body["refused"]}
    assert sorted(skipped) == ["here", "passwd.gguf", "self.gguf"], skipped
    shutil.copy(demo_dir / "demo-small.gguf", folder)  # the watch still sees what comes later
    deadline = time.monotonic() + 20
    while "demo-small" not in agent.models():
        assert time.monotonic() < deadline, agent.log()[-3000:]
        time.sleep(0.1)
    log = agent.log()
    assert "Traceback" not in log and "crashed" not in log, log[-3000:]
    # Said once each, not at every re-read of the folder.
    assert log.count("models-dir entry refused") == 3, log[-3000:]
