"""The host probe on this machine's kernel, with real processes (moved from the unit tier:
it spawns two interpreters and writes 64 MiB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from node_agent.memory.devices import HostProbe

MIB = 1 << 20


def test_two_processes_mapping_one_file_count_it(tmp_path: Path) -> None:
    """The same on this machine's kernel: two processes read one 64 MiB file through mmap."""
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(64 * MIB))
    script = (
        "import mmap, sys\n"
        "with open(sys.argv[1], 'rb') as f:\n"
        "    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "    sum(m[i] for i in range(0, len(m), 4096))\n"
        "    print('mapped', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "mapped\n"
        used = HostProbe().process_usage([child.pid for child in children])["host"]
        assert used >= 63 * MIB  # the file's pages, once in all (0 when only private count)
    finally:
        for child in children:
            child.kill()
            child.communicate()  # waits, and closes its pipes
