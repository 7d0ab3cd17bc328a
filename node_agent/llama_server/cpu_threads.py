"""How many threads a child computes with where the children compute on the CPU alone.

llama-server's default is a thread per physical core. ggml's threads meet at a barrier after
each operation of the model's graph and wait there by spinning (OpenMP's loop or ggml's own):
while one of them is not running, because a core is taken by another child, by the agent
proxying a stream, by its clients or by the user's other work, the others spin until it runs
again, and the child crawls. Measured on 2 cores (b11434, demo-medium, ``-c 512``, decode
tokens/s; issue 48): alone 256 with 2 threads; two children computing at once 17.7 and 14.3;
beside two spinning processes 15.1; both 2.5 and 2.3. With one thread each: 377; 435 and
380; 393; 147 and 133 (a child of one thread never waits at a barrier).

So each child runs a thread per physical core but one (at least one): the core left is for
everything else on the machine, the agent first. Alone on an idle machine a child loses at
most that core (on 2 cores, SmolLM2's decode 85 -> 48 tokens/s with the cores to itself);
on a machine whose cores are not all free it no longer falls 15-150 times. A model given its
own ``-t``, ``-C`` or ``-Cr``, or ``LLAMA_ARG_THREADS`` in the agent's environment, keeps what
its user chose.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

CPU_SYSFS = Path("/sys/devices/system/cpu")


def physical_cores(cpus: Iterable[int], core_of: Callable[[int], object | None]) -> int:
    """How many physical cores the logical ``cpus`` are on: ``core_of`` names a CPU's core
    (its package and core id), or None where it cannot say (each CPU then counts as one)."""
    cores: set[object] = set()
    for cpu in cpus:
        core = core_of(cpu)
        cores.add(core if core is not None else ("cpu", cpu))
    return len(cores)


def default_threads(physical: int) -> int:
    """A child's threads on ``physical`` cores: one per core but one, at least one."""
    return max(1, physical - 1)


def sysfs_core(cpu: int, root: Path = CPU_SYSFS) -> tuple[str, str] | None:
    """(package, core id) of a logical CPU, from sysfs; None where it is not readable."""
    topology = root / f"cpu{cpu}" / "topology"
    try:
        package = (topology / "physical_package_id").read_text().strip()
        core = (topology / "core_id").read_text().strip()
    except OSError:
        return None
    return package, core


def child_threads() -> int:
    """The threads of each child on this machine: the physical cores of the CPUs the agent
    may run on (its affinity), but one."""
    try:
        cpus: Iterable[int] = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        cpus = range(os.cpu_count() or 1)
    return default_threads(physical_cores(cpus, sysfs_core))
