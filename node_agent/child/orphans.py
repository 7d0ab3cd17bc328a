"""Find and end llama-server children that an earlier agent left behind.

Every child carries ``CORRAL_AGENT_TAG=<tag>`` and ``CORRAL_AGENT_PID=<pid of the agent that
spawned it>`` in its environment. A tagged process whose parent is no longer that agent was
reparented (to init or a subreaper) when its agent died: it is an orphan. Children of a live
agent, including this one, are left alone, so two agents may even share a tag.

Reads ``/proc/<pid>/environ`` and ``/proc/<pid>/stat``; processes of other users (unreadable)
and processes that vanish while scanned are skipped.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Final

TAG_ENV: Final = "CORRAL_AGENT_TAG"
AGENT_PID_ENV: Final = "CORRAL_AGENT_PID"

log = logging.getLogger("corral.orphans")


def tag_environment(tag: str, agent_pid: int | None = None) -> dict[str, str]:
    """The variables that mark a child as spawned by this agent."""
    return {TAG_ENV: tag, AGENT_PID_ENV: str(os.getpid() if agent_pid is None else agent_pid)}


def _environ(proc: Path) -> dict[str, str]:
    raw = (proc / "environ").read_bytes()
    result: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            result[key.decode(errors="replace")] = value.decode(errors="replace")
    return result


def _ppid(proc: Path) -> int:
    # The command name in field 2 may hold spaces and parentheses: split after the last ')'.
    stat = (proc / "stat").read_text(errors="replace")
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def find_orphans(tag: str, *, proc_root: Path = Path("/proc")) -> list[int]:
    """Pids of processes tagged ``tag`` whose spawning agent is no longer their parent."""
    me = os.getpid()
    found: list[int] = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = _environ(entry)
            if env.get(TAG_ENV) != tag:
                continue
            ppid = _ppid(entry)
        except (OSError, ValueError, IndexError):
            continue  # gone, a zombie without environ, or not ours to read
        # Without the agent's pid (tagged by hand): anything not our own child is an orphan.
        if str(ppid) != env.get(AGENT_PID_ENV, str(me)):
            found.append(int(entry.name))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); its memory is released, which is what matters here.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def end_orphans(tag: str, *, timeout: float = 5.0, proc_root: Path = Path("/proc")) -> list[int]:
    """SIGKILL every orphan tagged ``tag`` (and its process group) and wait until they are gone.

    An orphan gets no grace period: nobody is left to drain its requests, and it may hold a
    GPU's memory that the new agent's ledger is about to count as free. Returns the pids that
    were ended. Blocking (it is meant for agent start-up, before serving).
    """
    pids = find_orphans(tag, proc_root=proc_root)
    for pid in pids:
        log.warning("ending orphaned child pid=%d left by an earlier agent (tag=%s)", pid, tag)
        try:
            # Children run in a process group of their own: their pid is its number.
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = [pid for pid in pids if _alive(pid)]
    if left:
        log.error("orphaned children still alive after %.1fs: %s", timeout, left)
    return pids
