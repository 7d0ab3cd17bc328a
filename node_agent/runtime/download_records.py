"""The record of unfinished downloads (issue 29, item 9): a ``POST /models`` download is
written down when it starts and crossed out when it ends (done, refused by the source, or
cancelled by an unload), so that an agent restarted after a stop or a crash resumes what was
on its way, as llama.cpp's router does. Its partial files resume with ``Range``.

One small file per download in the agent's state folder (``state_home``), named by a hash of
the model's name (a client's text never names a file); at most :data:`MAX_RECORDS` are read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from node_agent.sources import hf_hub
from node_agent.state_home import private_folder

log = logging.getLogger("corral.downloads")

MAX_RECORDS = 64
MAX_RECORD_BYTES = 4096


def _file(folder: Path, name: str) -> Path:
    return folder / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.json"


class DownloadRecords:
    def __init__(self, folder: Path) -> None:
        self.folder = private_folder(folder)

    def add(self, name: str) -> None:
        path = _file(self.folder, name)
        partial = path.with_suffix(".tmp")
        partial.write_text(json.dumps({"model": name}))
        os.replace(partial, path)  # whole or absent, even if the agent dies here

    def remove(self, name: str) -> None:
        _file(self.folder, name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        """The downloads recorded unfinished; a record that is not one is deleted."""
        found: list[str] = []
        for path in sorted(self.folder.glob("*.json"))[:MAX_RECORDS]:
            try:
                if path.stat().st_size > MAX_RECORD_BYTES:
                    raise ValueError("too large")
                name = json.loads(path.read_text())["model"]
                hf_hub.split_repo_tag(name)  # the check POST /models made
                if path != _file(self.folder, name):
                    raise ValueError("not its name's record")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("download record %s is unreadable (%s): deleted", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            found.append(name)
        return found
