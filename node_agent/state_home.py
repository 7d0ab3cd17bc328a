"""Where the agent keeps what must outlive it: ``$XDG_STATE_HOME/corral`` (else
``~/.local/state/corral``): warm swaps' saved caches, the record of unfinished downloads."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def state_home(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home(), ".local/state"))
    return Path(base, "corral")


def private_folder(path: Path) -> Path:
    """``path``, made if missing, readable by this user only (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path
