"""A download always ends: failed, over, and startable again, whatever went wrong in its task
(issue 26, row 12), and a hub listing with a path no file can have is refused up front.

A hub path holding NUL made ``os.stat`` raise ValueError inside the download task, which caught
only DownloadError and OSError: the task died, the model stayed ``downloading`` for good,
``DELETE`` and requests waited forever and a second ``POST /models`` was "already exists".
"""

from __future__ import annotations

import asyncio

import pytest

from node_agent.runtime.event_hub import EventHub
from node_agent.runtime.model_downloads import Downloads, DownloadSettings
from node_agent.sources.download import DownloadError
from node_agent.sources.hf_hub import _tree_files

pytestmark = [pytest.mark.timeout(10), pytest.mark.usefixtures("no_leaked_tasks")]


async def test_a_download_that_fails_unexpectedly_ends_failed_and_may_start_again() -> None:
    events = EventHub()
    downloads = Downloads(events, DownloadSettings(env={}))

    async def broken() -> None:
        raise ValueError("embedded null byte")  # what os.stat says of a path with NUL

    # The task boundary under test: what start_repo does once its plan is made.
    downloads._begin("org/repo:Q8_0", frozenset({"/hub/blob"}))
    downloads._run("org/repo:Q8_0", broken(), becomes_model=True)
    await asyncio.wait_for(
        downloads.wait("org/repo:Q8_0", queue_timeout=None, left=None, max_queue=None), 5
    )
    assert not downloads.active("org/repo:Q8_0")
    assert (
        downloads.failed("org/repo:Q8_0") == "the download failed: ValueError: embedded null byte"
    )
    await asyncio.wait_for(downloads.wait_cancelled("org/repo:Q8_0"), 1)  # DELETE returns
    downloads._begin("org/repo:Q8_0", frozenset({"/hub/blob"}))  # a new POST is accepted
    assert downloads.active("org/repo:Q8_0")
    await downloads.close()


@pytest.mark.parametrize("path", ["nul\x00-Q8_0.gguf", "a\nb-Q8_0.gguf", "s\ud800-Q8_0.gguf"])
def test_a_listing_with_a_path_no_file_can_have_is_refused(path: str) -> None:
    tree = [{"type": "file", "path": "ok-Q4_0.gguf", "size": 1}, {"type": "file", "path": path}]
    with pytest.raises(DownloadError, match="lists a file path no file can have"):
        _tree_files(tree, "org/repo")
