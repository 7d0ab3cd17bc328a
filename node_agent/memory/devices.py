"""Device probes: how much memory each device has and what our children use of it.

Behind the :class:`DeviceProbe` protocol so the registry and tests see one seam:

* :class:`HostProbe`: the host's RAM from ``/proc/meminfo`` (``MemTotal``,
  ``MemAvailable``, which counts reclaimable page cache as free the way the kernel would
  hand it out), capped by the agent's cgroup limit (``cgroup.py``: a pod's memory limit), and
  what a child holds for its model from ``/proc/PID/smaps`` (:func:`_model_memory`).
* :class:`NvmlProbe`: NVIDIA GPUs through NVML (``pynvml``, the optional ``nvidia`` extra),
  named ``CUDA0``… in NVML's order, which is PCI bus order; children must run with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (:data:`CHILD_ENV`) so CUDA numbers them the same way.
  Per-process use comes from NVML's running-process list.
* :func:`open_probes`: the host always, plus NVML when the library loads and sees a GPU.
  Without NVML the agent runs on the host ledger alone.

``--memory-limit`` is not applied here: the ledger caps ``available`` with it, which is the
same as capping ``total`` while keeping ``free`` real (see ``node_agent.core.ledger``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from node_agent.core.ledger import DeviceReading
from node_agent.extras import install_hint
from node_agent.memory.cgroup import cgroup_memory

log = logging.getLogger("corral.devices")

HOST = "host"
# Environment for every child: CUDA's default order is "fastest first", NVML's is PCI bus
# order; without this CUDA0 in a child's log could be another GPU than NVML's CUDA0.
CHILD_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")  # a mapping's first line in /proc/PID/smaps


class DeviceProbe(Protocol):
    """Reads devices and per-process use; implementations must not raise on a dead pid."""

    def read(self) -> list[DeviceReading]: ...

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        """Bytes ``pids`` together hold per device (devices where they hold nothing omitted)."""
        ...


class HostProbe:
    def __init__(self, proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> None:
        self.proc = proc
        self.cgroups = cgroups

    def read(self) -> list[DeviceReading]:
        fields = _kib_fields(self.proc / "meminfo", ("MemTotal", "MemAvailable"))
        total, free = fields.get("MemTotal", 0), fields.get("MemAvailable", 0)
        if not total:
            return []
        # A container sees the node's meminfo: its cgroup's limit is what it may use.
        limited = cgroup_memory(self.proc, self.cgroups)
        if limited is not None and limited.limit < total:
            total, free = limited.limit, min(free, limited.free)
        return [DeviceReading(HOST, total, free)]

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        used = sum(_model_memory(self.proc / str(pid) / "smaps") for pid in pids)
        return {HOST: used} if used else {}


def _model_memory(smaps: Path) -> int:
    """What a child holds for its model: its share of the pages it maps, less the program's.

    Proportional shares (``Pss``): a page two processes map counts half to each, so the
    weights of one file that two children map are counted once in all, not twice, and not
    zero times (private pages alone would give zero: every page of the file is shared then).
    The pages of llama-server and its libraries belong to no model (25 MiB measured for the
    pinned binary): the clean pages of a file the process maps as code (an ELF object: the
    binary, its libraries) are left out; dirty pages all count (heap, KV, repacked weights).
    A kernel without ``Pss_Dirty`` (before 6.0) gives private pages only, as before.
    """
    try:
        text = smaps.read_text()
    except OSError:  # the process exited between listing and reading: it holds nothing
        return 0
    mappings: list[tuple[str, bool, dict[str, int]]] = []  # path, executable, fields in bytes
    for line in text.splitlines():
        if _MAPPING.match(line):  # "start-end perms offset dev inode [path]"
            parts = line.split(maxsplit=5)
            mappings.append((parts[5] if len(parts) > 5 else "", "x" in parts[1], {}))
        elif mappings and line.startswith(_FIELDS):
            key, value = line.split(":", 1)
            mappings[-1][2][key] = int(value.split()[0]) * 1024
    code_files = {path for path, code, _ in mappings if code and path.startswith("/")}
    total = 0
    for path, _, field in mappings:
        if "Pss_Dirty" in field:
            total += field["Pss_Dirty"] if path in code_files else field.get("Pss", 0)
        else:
            clean = 0 if path in code_files else field.get("Private_Clean", 0)
            total += clean + field.get("Private_Dirty", 0)
    return total


_FIELDS = ("Pss:", "Pss_Dirty:", "Private_Clean:", "Private_Dirty:")


class NvmlLibrary(Protocol):
    """The part of ``pynvml`` the probe uses (a test seam: a fake implements this)."""

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        """An object with ``total`` and ``free`` in bytes."""
        ...

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]:
        """Objects with ``pid`` and ``usedGpuMemory`` (None where the driver hides it)."""
        ...


class NvmlProbe:
    def __init__(self, nvml: NvmlLibrary) -> None:
        self.nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def read(self) -> list[DeviceReading]:
        readings = []
        for index, handle in enumerate(self.handles):
            info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(DeviceReading(f"CUDA{index}", int(info.total), int(info.free)))
        return readings

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        wanted = set(pids)
        usage = {}
        for index, handle in enumerate(self.handles):
            used = sum(
                int(p.usedGpuMemory or 0)
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid in wanted
            )
            if used:
                usage[f"CUDA{index}"] = used
        return usage


class CompositeProbe:
    """Several probes read as one."""

    def __init__(self, probes: Sequence[DeviceProbe]) -> None:
        self.probes = list(probes)

    def read(self) -> list[DeviceReading]:
        return [r for probe in self.probes for r in probe.read()]

    def process_usage(self, pids: Collection[int]) -> dict[str, int]:
        usage: dict[str, int] = {}
        for probe in self.probes:
            usage.update(probe.process_usage(pids))
        return usage


def load_nvml() -> NvmlLibrary | None:
    """``pynvml`` initialised, or None where it is not installed or finds no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError and friends: no driver, no GPU
        log.info("NVML unavailable (%s): the ledger covers host memory only", exc)
        return None
    lib: NvmlLibrary = pynvml
    return lib


def open_probes(nvml: NvmlLibrary | None = None, *, use_nvml: bool = True) -> CompositeProbe:
    """The host, plus every NVIDIA GPU when NVML is usable."""
    probes: list[DeviceProbe] = [HostProbe()]
    lib = nvml if nvml is not None else (load_nvml() if use_nvml else None)
    if lib is not None:
        with contextlib.suppress(Exception):  # a driver that answers init but not queries
            gpu = NvmlProbe(lib)
            if gpu.handles:
                probes.append(gpu)
    return CompositeProbe(probes)


def missing_gpus(expected: int, probe: DeviceProbe) -> str | None:
    """What is wrong when ``probe`` sees fewer than ``expected`` GPUs (``--expect-gpus``)."""
    gpus = [reading.name for reading in probe.read() if reading.name != HOST]
    if len(gpus) >= expected:
        return None
    if gpus:
        why = f"NVML sees only {', '.join(gpus)}"
    elif importlib.util.find_spec("pynvml"):
        why = "NVML sees no NVIDIA GPU"
    else:
        why = f"NVML is not installed ({install_hint('nvidia')})"
    return (
        f"--expect-gpus {expected}: {why}, so models would run on the CPU; give the agent its "
        "GPUs (in Kubernetes: the NVIDIA runtime, the chart's agent.gpu.runtimeClassName) "
        "and restart it"
    )


def _kib_fields(path: Path, names: Sequence[str]) -> dict[str, int]:
    """``Name:  123 kB`` lines of a /proc file, in bytes; empty when the file is gone."""
    try:
        text = path.read_text()
    except OSError:  # the process exited between listing and reading: it holds nothing
        return {}
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            out[name] = int(rest.split()[0]) * 1024
    return out
