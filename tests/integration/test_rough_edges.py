"""Issue 29's rough edges, each through the real agent or the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.harness import REPO, AgentProcess

TINY = "demo-tiny"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_ui_with_a_slash_leads_to_ui_and_ui_links_to_the_chat(
    start_agent: Any, demo_dir: Path
) -> None:
    agent: AgentProcess = start_agent("--models-dir", str(demo_dir), "--api-key", "k")
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(agent.url + "/ui/")
        raise AssertionError("/ui/ answered without a redirect")
    except urllib.error.HTTPError as err:  # the redirect, not followed
        assert (err.code, err.headers["Location"]) == (301, "/ui")  # no key needed either
    with urllib.request.urlopen(agent.url + "/ui/") as page:  # followed
        html = page.read().decode()
    assert '<a id="chat-link" href="/"' in html


def test_a_reader_that_leaves_early_gets_no_traceback(start_agent: Any, demo_dir: Path) -> None:
    """``corral status --json | head``: the reader goes before corral writes."""
    agent: AgentProcess = start_agent("--models-dir", str(demo_dir))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "LLAMA_"))}
    read, write = os.pipe()
    os.close(read)  # a reader that already left: the first write is EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "node_agent.cli", "status", "--json", "--url", agent.url],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.stderr == "", done.stderr
    assert done.returncode == 141  # as a program killed by SIGPIPE
