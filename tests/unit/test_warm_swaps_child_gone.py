"""Warm swaps' requests to a child that is gone: the saved caches are not the files' fault.

In the soak (issue 48), an admin unload that came while a model loaded stopped its child
during the restore; each slot's restore then failed to connect, and every file was deleted
as if the child had refused it, so the next load was cold.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from node_agent.core.warm_book import OPEN, identity, sealed_file, slot_file
from node_agent.runtime.warm_swaps import WarmSwaps


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_restore_into_a_child_that_is_gone_keeps_the_files(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    warm = WarmSwaps(tmp_path / "warm", 1 << 30, binary, keyed=False)
    key = identity(("/m/a.gguf", 1000, 5), ("/b/llama-server", 10, 7), ())
    files = []
    for slot in range(2):
        data = f"slot {slot}".encode()
        name = sealed_file(slot_file(key, OPEN, slot), hashlib.sha256(data).hexdigest())
        (warm.folder / name).write_bytes(data)
        files.append(warm.folder / name)
    restored = await warm.restore("a", closed_port(), key, 4, frozenset({OPEN}))
    assert restored == 0
    assert all(file.exists() for file in files)
    assert warm.statistics.dropped == 0
