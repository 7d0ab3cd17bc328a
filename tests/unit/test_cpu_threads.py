"""A child's threads where the children compute on the CPU alone (issue 48: the crawl)."""

from __future__ import annotations

import os
from pathlib import Path

from node_agent.llama_server import cpu_threads
from node_agent.llama_server.cpu_threads import default_threads, physical_cores, sysfs_core


def test_a_core_is_left_to_the_rest_of_the_machine() -> None:
    assert [default_threads(n) for n in (1, 2, 3, 4, 8, 64)] == [1, 1, 2, 3, 7, 63]
    assert default_threads(0) == 1  # never none


def test_hyperthreads_count_once_and_unknown_cpus_each_once() -> None:
    # 4 logical CPUs on 2 cores (siblings 0/2 and 1/3), as sysfs names them.
    siblings = {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1")}
    assert physical_cores(range(4), siblings.get) == 2
    assert physical_cores([0, 2], siblings.get) == 1  # the affinity holds one core
    assert physical_cores(range(3), lambda cpu: None) == 3
    # Two packages may reuse core ids.
    packages = {0: ("0", "0"), 1: ("1", "0")}
    assert physical_cores([0, 1], packages.get) == 2


def test_sysfs_topology(tmp_path: Path) -> None:
    topology = tmp_path / "cpu3" / "topology"
    topology.mkdir(parents=True)
    (topology / "physical_package_id").write_text("1\n")
    (topology / "core_id").write_text("7\n")
    assert sysfs_core(3, tmp_path) == ("1", "7")
    assert sysfs_core(4, tmp_path) is None


def test_this_machine_gets_at_least_one_thread() -> None:
    assert 1 <= cpu_threads.child_threads() <= max(1, len(os.sched_getaffinity(0)))
