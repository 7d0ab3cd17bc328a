"""Device probes through the DeviceProbe seam: host /proc files and a fake NVML."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from node_agent.core.ledger import MemoryLedger, freed_memory_visible
from node_agent.memory import devices
from node_agent.memory.devices import (
    CHILD_ENV,
    DeviceProbe,
    HostProbe,
    NvmlProbe,
    open_probes,
)

GIB = 1 << 30


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


@dataclass
class _MemInfo:
    total: int
    free: int


@dataclass
class FakeNvml:
    """One GPU; an exited process's memory shows free only ``lag`` reads later (as drivers do)."""

    total: int
    procs: dict[int, int] = field(default_factory=dict)
    lag: int = 2
    _freed: list[list[int]] = field(default_factory=list)  # [bytes, reads left]

    def exit(self, pid: int) -> None:
        self._freed.append([self.procs.pop(pid), self.lag])

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> _MemInfo:
        pending = sum(size for size, _ in self._freed)
        for item in self._freed:
            item[1] -= 1
        self._freed = [item for item in self._freed if item[1] > 0]
        return _MemInfo(self.total, self.total - sum(self.procs.values()) - pending)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[_Proc]:
        return [_Proc(pid, size) for pid, size in self.procs.items()] + [_Proc(999, None)]


def test_nvml_probe_reads_devices_and_per_process_memory() -> None:
    nvml = FakeNvml(total=24 * GIB, procs={10: 3 * GIB, 11: 5 * GIB, 12: GIB})
    probe: DeviceProbe = NvmlProbe(nvml)
    (reading,) = probe.read()
    assert (reading.name, reading.total, reading.free) == ("CUDA0", 24 * GIB, 15 * GIB)
    assert probe.process_usage([10, 12, 999]) == {"CUDA0": 4 * GIB}  # hidden usage counts 0
    assert probe.process_usage([4242]) == {}


def test_ledger_waits_until_late_freed_gpu_memory_shows() -> None:
    """Make room through the probe seam: the victim's memory appears free two reads late."""
    nvml = FakeNvml(total=10 * GIB, procs={100: 6 * GIB}, lag=2)
    probe = NvmlProbe(nvml)
    ledger = MemoryLedger(margin=0)
    ledger.set_estimate("old", {"CUDA0": 5 * GIB})
    ledger.set_estimate("new", {"CUDA0": 7 * GIB})
    ledger.on_spawned("old")
    ledger.on_ready("old", probe.process_usage([100]))
    ledger.calibrate(probe.read())
    assert ledger.pick_victim("new", ["old"]) == "old"

    baseline = {r.name: r.free for r in probe.read()}
    expected = ledger.held("old")
    nvml.exit(100)
    ledger.on_unloaded("old")
    reads = 0
    while True:  # the registry's bounded wait, without the sleeps
        reads += 1
        fresh = probe.read()
        if freed_memory_visible(baseline, fresh, expected):
            break
        assert reads < 5
    assert reads == 3  # two stale readings, then the memory shows free
    ledger.calibrate(fresh)
    assert ledger.statistics().devices[0].external == 0
    assert not ledger.deficit("new")


def test_a_stale_reading_would_have_inflated_external() -> None:
    """Why the wait matters: calibrating on a late reading counts the dead child as external."""
    nvml = FakeNvml(total=10 * GIB, procs={100: 6 * GIB}, lag=1)
    probe = NvmlProbe(nvml)
    ledger = MemoryLedger(margin=0)
    nvml.exit(100)
    ledger.calibrate(probe.read())
    assert ledger.statistics().devices[0].external == 6 * GIB


def test_host_probe_reads_meminfo_and_smaps_rollup(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20480000 kB\n"
    )
    (tmp_path / "42").mkdir()
    # the program's code and read-only data (clean, its own while no other process maps
    # them), the model file (clean), the heap and anonymous buffers (dirty)
    (tmp_path / "42" / "smaps").write_text(
        "5583a000-5583b000 r--p 00000000 fe:00 11 /opt/llama-server\n"
        "Private_Clean:     3000 kB\nPrivate_Dirty:        0 kB\n"
        "5583b000-5583c000 r-xp 00001000 fe:00 11 /opt/llama-server\n"
        "Private_Clean:     7000 kB\nPrivate_Dirty:        0 kB\n"
        "7f00a000-7f00b000 r-xp 00000000 fe:00 12 /opt/libggml-cpu.so\n"
        "Private_Clean:     9000 kB\nPrivate_Dirty:        0 kB\n"
        "7f00b000-7f00c000 rw-p 00010000 fe:00 12 /opt/libggml-cpu.so\n"
        "Private_Clean:        0 kB\nPrivate_Dirty:      400 kB\n"
        "7f10a000-7f20b000 r--s 00023000 fe:00 13 /models/m.gguf\n"
        "Shared_Clean:     10000 kB\nPrivate_Clean:    60000 kB\nPrivate_Dirty:        0 kB\n"
        "7f30a000-7f40b000 rw-p 00000000 00:00 0 \n"
        "Private_Clean:        0 kB\nPrivate_Dirty:    20000 kB\n"
        "7f50a000-7f50b000 rw-p 00000000 00:00 0 [heap]\n"
        "Private_Clean:        0 kB\nPrivate_Dirty:     1000 kB\n"
    )
    probe: DeviceProbe = HostProbe(tmp_path)
    (reading,) = probe.read()
    assert (reading.name, reading.total, reading.free) == ("host", 24576000 * 1024, 20480000 * 1024)
    # the model file, the buffers, the heap and the libraries' written data; not their code
    assert probe.process_usage([42]) == {"host": (60000 + 20000 + 1000 + 400) * 1024}
    assert probe.process_usage([43]) == {}  # exited: holds nothing, no error


def test_host_probe_counts_a_shared_model_file_once_in_all(tmp_path: Path) -> None:
    """Two children mapping one model file: every page of it is shared, none private. Each
    child counts its proportional share (Pss), so the two together count the file once."""
    for pid in (42, 43):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps").write_text(
            "5583b000-5583c000 r-xp 00001000 fe:00 11 /opt/llama-server\n"
            "Pss:               3500 kB\nPss_Dirty:             0 kB\n"
            "Private_Clean:        0 kB\nPrivate_Dirty:        0 kB\n"
            "5583c000-5583d000 rw-p 00002000 fe:00 11 /opt/llama-server\n"
            "Pss:                 64 kB\nPss_Dirty:            64 kB\n"
            "Private_Clean:        0 kB\nPrivate_Dirty:       64 kB\n"
            "7f10a000-7f20b000 r--s 00023000 fe:00 13 /models/m.gguf\n"
            "Pss:              30000 kB\nPss_Dirty:             0 kB\n"
            "Private_Clean:        0 kB\nPrivate_Dirty:        0 kB\n"
            "7f30a000-7f40b000 rw-p 00000000 00:00 0 \n"
            "Pss:              20000 kB\nPss_Dirty:         20000 kB\n"
            "Private_Clean:        0 kB\nPrivate_Dirty:    20000 kB\n"
        )
    probe = HostProbe(tmp_path)
    # half the 60000 kB file each, the buffers, the program's written data; not its code
    assert probe.process_usage([42]) == {"host": (30000 + 20000 + 64) * 1024}
    assert probe.process_usage([42, 43]) == {"host": 2 * (30000 + 20000 + 64) * 1024}


def test_host_probe_on_this_machine() -> None:
    (reading,) = HostProbe().read()
    assert 0 < reading.free <= reading.total
    assert HostProbe().process_usage([os.getpid()])["host"] > 0


def test_without_nvml_only_the_host_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    assert devices.load_nvml() is None
    names = [r.name for r in open_probes().read()]
    assert names == ["host"]


def test_with_a_gpu_the_composite_probe_lists_both() -> None:
    probe = open_probes(FakeNvml(total=8 * GIB, procs={7: GIB}))
    assert [r.name for r in probe.read()] == ["host", "CUDA0"]
    assert probe.process_usage([7]) == {"CUDA0": GIB}
    assert CHILD_ENV == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_missing_gpus_says_what_is_missing_and_how_to_fix_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one_gpu = open_probes(FakeNvml(total=8 * GIB))
    assert devices.missing_gpus(1, one_gpu) is None
    short = devices.missing_gpus(2, one_gpu)
    assert short is not None and short.startswith("--expect-gpus 2: NVML sees only CUDA0, ")
    assert "runtimeClassName" in short
    monkeypatch.setitem(sys.modules, "pynvml", None)
    none = devices.missing_gpus(1, open_probes())
    assert none is not None and "NVML is not installed" in none and "pip install" in none
