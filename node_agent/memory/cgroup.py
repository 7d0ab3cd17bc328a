"""The memory limit of the agent's own cgroup: what a container may really use of the host.

In a pod, ``/proc/meminfo`` still shows the whole node: an agent whose container may use
16 GiB of a 512 GiB node would plan with 512 GiB and be OOM-killed by its cgroup. The host
device's total is therefore the smallest ``memory.max`` (cgroup v2) or
``memory.limit_in_bytes`` (v1) of the agent's cgroup and its ancestors, and its free memory at
most that limit minus the cgroup's usage. Children share the agent's cgroup (they are its
processes), so the limit binds them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    limit: int
    usage: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.usage)


def cgroup_memory(proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")) -> (
    CgroupMemory | None
):  # fmt: skip
    """This process's cgroup memory limit and usage; None where no limit is set or readable."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/path", one unified hierarchy
            found = _lowest(root, path, "memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1: "4:memory:/path"
            found = _lowest(root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        if found is not None:
            return found
    return None


def _lowest(mount: Path, path: str, limit_file: str, usage_file: str) -> CgroupMemory | None:
    # Inside a container the cgroup namespace makes the mount point its own cgroup, and the
    # path from /proc/self/cgroup may not exist under it: fall back to the mount root.
    here = mount / path.lstrip("/")
    if not here.is_dir():
        here = mount
    usage = _number(here / usage_file)
    limits = []
    level = here
    while True:
        value = _number(level / limit_file)
        if value is not None and value < _V1_UNLIMITED:
            limits.append(value)
        if level == mount or mount not in level.parents:
            break
        level = level.parent
    if not limits or usage is None:
        return None
    return CgroupMemory(min(limits), usage)


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit
