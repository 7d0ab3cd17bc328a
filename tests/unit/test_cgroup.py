"""The host's memory as a container may use it: the cgroup's limit caps /proc/meminfo."""

from __future__ import annotations

from pathlib import Path

from node_agent.memory.cgroup import CgroupMemory, cgroup_memory
from node_agent.memory.devices import HostProbe

GIB = 1 << 30


def fake_proc(tmp_path: Path, cgroup_line: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "meminfo").write_text("MemTotal: 536870912 kB\nMemAvailable: 500000000 kB\n")
    return proc


def write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def test_v2_a_pod_limit_caps_the_host(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "0::/kubepods/pod1/agent")
    root = tmp_path / "cgroup"
    write(root / "kubepods", memory_max="max")
    write(root / "kubepods" / "pod1", memory_max=str(16 * GIB))  # the pod's limit
    write(root / "kubepods" / "pod1" / "agent", memory_max="max", memory_current=str(6 * GIB))
    assert cgroup_memory(proc, root) == CgroupMemory(16 * GIB, 6 * GIB)
    (reading,) = HostProbe(proc, root).read()
    assert (reading.total, reading.free) == (16 * GIB, 10 * GIB)


def test_v2_in_a_cgroup_namespace_the_mount_is_the_own_cgroup(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "0::/")
    root = tmp_path / "cgroup"
    write(root, memory_max=str(8 * GIB), memory_current=str(GIB))
    assert cgroup_memory(proc, root) == CgroupMemory(8 * GIB, GIB)


def test_v1_memory_controller(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "4:memory:/docker/abc\n3:cpu:/docker/abc")
    root = tmp_path / "cgroup"
    write(root / "memory", memory_limit_in_bytes="9223372036854771712")  # no limit
    write(
        root / "memory" / "docker" / "abc",
        memory_limit_in_bytes=str(4 * GIB),
        memory_usage_in_bytes=str(GIB),
    )
    assert cgroup_memory(proc, root) == CgroupMemory(4 * GIB, GIB)


def test_no_limit_leaves_meminfo(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "0::/user.slice")
    root = tmp_path / "cgroup"
    write(root / "user.slice", memory_max="max", memory_current=str(GIB))
    assert cgroup_memory(proc, root) is None
    (reading,) = HostProbe(proc, root).read()
    assert reading.total == 536870912 * 1024
    assert cgroup_memory(tmp_path / "nowhere", root) is None
