"""``corral models|load|unload|status`` against a real agent, run as the user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.harness import REPO, AgentProcess, free_port

TINY, SMALL = "demo-tiny", "demo-small"


def corral(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> Any:
    """Run ``corral ARGS`` (stdout is a pipe, not a TTY); returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "LLAMA_"))}
    full_env.update(env or {})
    if url is not None:
        full_env["CORRAL_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "node_agent.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=60,
    )


def test_models_load_unload_status(start_agent: Any, demo_dir: Path) -> None:
    agent: AgentProcess = start_agent("--models-dir", str(demo_dir), "-c", "1024")

    listed = corral("models", url=agent.url)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "STATE", "ALIASES", "MEMORY", "IN", "FLIGHT", "QUEUED"]
    assert {r.split()[0]: r.split()[1] for r in rows} == {
        "demo-medium": "unloaded",
        SMALL: "unloaded",
        TINY: "unloaded",
    }

    loaded = corral("load", TINY, "--url", agent.url)
    assert loaded.returncode == 0, loaded.stderr
    lines = loaded.stdout.splitlines()
    # Not a TTY: plain progress lines, then the outcome.
    assert lines[0] == f"loading {TINY} …"
    assert lines[-1].startswith(f"{TINY} loaded in ")
    assert agent.state(TINY) == "loaded"

    again = corral("load", TINY, url=agent.url)
    assert (again.returncode, again.stdout.strip()) == (0, f"{TINY} is already loaded")

    as_json = corral("models", "--json", url=agent.url)
    models = {m["id"]: m for m in json.loads(as_json.stdout)}
    assert models[TINY]["status"]["value"] == "loaded"
    assert models[TINY]["corral"]["in_flight"] == 0

    status = corral("status", url=agent.url)
    assert status.returncode == 0, status.stderr
    assert f"agent      {agent.url}" in status.stdout
    assert "instances  1 running of 4 (3 models known)" in status.stdout
    assert "memory ledger off" in status.stdout
    # The ledger off: a running model's memory is its process's own (as `corral ps` and the
    # status page give it); it was "-" for every model.
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if line}
    assert re.search(r"  process \d+\.\d MiB  ", rows[TINY]), rows[TINY]
    assert "process" not in rows[SMALL], rows[SMALL]
    (tiny_row,) = [r for r in corral("models", url=agent.url).stdout.splitlines() if TINY in r]
    assert re.search(r"  process \d+\.\d MiB  ", tiny_row), tiny_row
    status_json = json.loads(corral("status", "--json", url=agent.url).stdout)
    assert status_json["props"]["role"] == "router"
    assert status_json["ledger"] is None

    unloaded = corral("unload", TINY, url=agent.url)
    assert unloaded.returncode == 0, unloaded.stderr
    assert unloaded.stdout.startswith(f"{TINY} unloaded in ")
    assert agent.state(TINY) == "unloaded"
    # Unloading an unloaded model is done already, as loading a loaded one is.
    again = corral("unload", TINY, url=agent.url)
    assert (again.returncode, again.stdout.strip()) == (0, f"{TINY} is already unloaded")


def test_load_and_unload_json(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "-c", "1024")

    def outcome(*args: str) -> dict[str, Any]:
        done = corral(*args, "--json", url=agent.url)
        assert done.returncode == 0, done.stderr
        parsed: dict[str, Any] = json.loads(done.stdout)  # one document: no progress lines
        return parsed

    loaded = outcome("load", TINY)
    assert loaded.pop("seconds") > 0
    assert loaded == {"model": TINY, "status": "loaded", "changed": True}
    assert agent.state(TINY) == "loaded"
    assert outcome("load", TINY) == {"model": TINY, "status": "loaded", "changed": False}
    unloaded = outcome("unload", TINY)
    assert unloaded.pop("seconds") >= 0
    assert unloaded == {"model": TINY, "status": "unloaded", "changed": True}
    assert outcome("unload", TINY) == {"model": TINY, "status": "unloaded", "changed": False}
    assert outcome("load", SMALL, "--no-wait") == {
        "model": SMALL,
        "status": "loading",
        "changed": True,
    }
    agent.wait_state(SMALL, "loaded")


def test_errors_are_clear(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir))
    # One wording for load and unload, naming the models there are.
    for command in ("load", "unload"):
        unknown = corral(command, "no-such-model", url=agent.url)
        assert unknown.returncode == 1
        assert unknown.stderr == (
            f"corral {command}: the agent has no model named 'no-such-model'; its models: "
            f"demo-medium, {SMALL}, {TINY}\n"
        )

    # host:port without a scheme, as llama.cpp's users type it, is http://host:port.
    bare = corral("models", "--url", f"127.0.0.1:{agent.port}")
    assert bare.returncode == 0, bare.stderr
    assert TINY in bare.stdout
    wrong_scheme = corral("models", "--url", f"ftp://127.0.0.1:{agent.port}")
    assert wrong_scheme.returncode == 2
    assert "the agent speaks http://, https:// or unix://, not ftp://" in wrong_scheme.stderr

    nobody = f"http://127.0.0.1:{free_port()}"
    refused = corral("models", url=nobody)
    assert refused.returncode == 3
    assert f"cannot reach the agent at {nobody}" in refused.stderr
    assert "Connection refused" in refused.stderr

    usage = corral("load", url=agent.url)  # no model named
    assert usage.returncode == 2
    assert "the following arguments are required: name" in usage.stderr


def test_api_key_from_flag_and_env(start_agent: Any, demo_dir: Path) -> None:
    agent = start_agent("--models-dir", str(demo_dir), "--api-key", "sekret")
    denied = corral("models", url=agent.url)
    assert denied.returncode == 1
    assert denied.stderr.splitlines() == [
        "corral models: the agent answered 401: Invalid API Key",
        "(the agent wants an API key: pass --api-key KEY or set CORRAL_API_KEY)",
    ]
    wrong = corral("models", url=agent.url, env={"CORRAL_API_KEY": "wrong"})
    assert wrong.returncode == 1
    assert "the agent refused the key from CORRAL_API_KEY" in wrong.stderr
    wrong_flag = corral("models", "--api-key", "wrong", url=agent.url)
    assert "the agent refused the key from --api-key" in wrong_flag.stderr
    assert corral("models", "--api-key", "sekret", url=agent.url).returncode == 0
    assert corral("models", url=agent.url, env={"LLAMA_API_KEY": "sekret"}).returncode == 0
    loaded = corral("load", SMALL, url=agent.url, env={"CORRAL_API_KEY": "sekret"})
    assert loaded.returncode == 0, loaded.stderr
    _, body = agent.get("/models", headers={"Authorization": "Bearer sekret"})
    assert {m["id"]: m["status"]["value"] for m in body["data"]}[SMALL] == "loaded"


def test_a_failed_load_says_so(start_agent: Any, demo_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)  # not a loadable model
    agent = start_agent("--models-dir", str(tmp_path))
    failed = corral("load", "broken", url=agent.url)
    assert failed.returncode == 1
    assert "broken failed to load" in failed.stdout


def test_version() -> None:
    from importlib.metadata import version

    shown = corral("--version")
    assert (shown.returncode, shown.stdout) == (0, f"corral {version('corral')}\n")
    assert corral("agent", "--version").stdout == shown.stdout
