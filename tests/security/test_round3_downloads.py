"""Issue 50 (security round 3), rows 3 and 4: what a hub says bounds a download, and its
listing is read whole.

Row 3: a file the tree lists at 1,000 bytes, served with ``Content-Length: 10^12``, wrote
200 MB until the server stopped, and the partial file was kept; a file with no size listed and
no length sent was accepted as the model. Row 4: ``content.read(MAX_API_BYTES + 1)`` returns
what is buffered, not the whole body: a valid 200 KB listing sent in two halves got 400 "the
model endpoint's answer is not JSON".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node_agent.sources.download import DownloadError, Limits, transfer
from tests.integration.harness import AgentProcess, wait_until
from tests.integration.hf_server import HubServer, start_hub
from tests.integration.model_events import EventLog

REPO = "corral-test/tiny"
MODEL = f"{REPO}:Q8_0"
FILE = "tiny-Q8_0.gguf"


@pytest.fixture
def hub(demo_dir: Path) -> Iterator[HubServer]:
    server = start_hub()
    server.add(REPO, {FILE: (demo_dir / "demo-tiny.gguf").read_bytes()})
    yield server
    server.close()


@pytest.fixture
def env(tmp_path: Path, hub: HubServer) -> dict[str, str]:
    return {"HF_HOME": str(tmp_path / "hf"), "MODEL_ENDPOINT": hub.url + "/", "LLAMA_CACHE": ""}


def blobs(env: dict[str, str]) -> list[Path]:
    folder = Path(env["HF_HOME"], "hub", "models--corral-test--tiny", "blobs")
    return sorted(folder.glob("*")) if folder.is_dir() else []


def pull(agent: AgentProcess) -> str:
    """POST /models, then the download's end: the model's error, or '' when it was added."""
    with EventLog(agent.port) as events:
        assert agent.post("/models", {"model": MODEL})[0] == 200
        wait_until(
            lambda: {"download_failed", "download_finished"} & set(events.names(MODEL)),
            "the download's end",
        )
        if "download_finished" in events.names(MODEL):
            return ""
    entry = agent.models().get(MODEL)
    return str(entry["corral"]["error"]) if entry else agent.log()


def test_a_length_over_the_declared_size_is_refused_and_nothing_kept(
    start_agent: Any, hub: HubServer, env: dict[str, str]
) -> None:
    hub.declared[FILE] = 1000
    hub.claim_length = 10**12
    agent = start_agent("-c", "512", env=env)
    error = pull(agent)
    assert "sends 1000000000000 bytes of a file declared at 1000 bytes" in error, error
    assert blobs(env) == []  # no partial file to resume
    assert MODEL not in agent.models()


def test_a_file_of_no_known_size_is_not_taken_as_the_model(
    start_agent: Any, hub: HubServer, env: dict[str, str]
) -> None:
    hub.unsized = True
    agent = start_agent("-c", "512", env=env)
    error = pull(agent)
    assert "no size" in error and "cannot be told complete" in error, error
    assert blobs(env) == []
    assert MODEL not in agent.models()


def test_a_listing_that_arrives_in_two_reads_is_read_whole(
    start_agent: Any, hub: HubServer, env: dict[str, str]
) -> None:
    files = dict(hub.repos[REPO])
    files.update({f"docs/page-{i:04d}.md": b"x" for i in range(2000)})  # a 200 KB listing
    hub.add(REPO, files)
    hub.split_listing = 0.3
    agent = start_agent("-c", "512", env=env)
    assert pull(agent) == ""
    assert MODEL in agent.models()


async def test_a_download_never_fills_the_disk(hub: HubServer, tmp_path: Path) -> None:
    """Row 3: nothing bounded a download by default; now it leaves the disk a reserve (1 GiB
    by default: here one larger than the disk's free space, which the file cannot fit in)."""
    stats = os.statvfs(tmp_path)
    free = stats.f_bavail * stats.f_frsize
    final = tmp_path / "cache" / FILE
    url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DownloadError, match=r"stopped: the disk of .* MiB free, and a downl"):
            await transfer(session, url, final, limits=Limits(reserve_bytes=free))
    assert not list(final.parent.glob("*"))  # nothing left behind
    assert Limits().reserve_bytes == 1 << 30
