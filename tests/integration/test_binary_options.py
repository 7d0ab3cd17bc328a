"""The options of the llama-server in use: its own ``--help``, not a table of another build's.

``--n-cpu-ffn`` is new in b11434 (b10434 has no such option): with b11434 as the child it is a
valid preset key and flag, and reaches the child; with a binary that lacks it (b11434 behind a
wrapper that answers ``--help`` and ``--version`` as b10434 does) the same preset is refused,
and the error names that binary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.harness import REPO, chat, free_port

NEW_OPTION = "n-cpu-ffn"


def preset(tmp_path: Path, demo_dir: Path) -> Path:
    ini = tmp_path / "presets.ini"
    ini.write_text(f"[tiny]\nmodel = {demo_dir / 'demo-tiny.gguf'}\n{NEW_OPTION} = 0\n")
    return ini


def test_an_option_only_b11434_has_works_with_it(
    start_agent: Any, b11434: Path, demo_dir: Path, tmp_path: Path
) -> None:
    agent = start_agent(
        "--llama-server", str(b11434), "--models-preset", str(preset(tmp_path, demo_dir))
    )
    status, body = agent.post("/v1/chat/completions", chat("tiny", ignore_eos=True))
    assert status == 200, body
    entry = agent.models()["tiny"]
    assert f"--{NEW_OPTION}" in entry["status"]["args"]
    # The sdist has no git folder: the build names its number and source (issue 49 item 7;
    # before, every one of these said build 0, commit unknown).
    assert agent.get("/props")[1]["build_info"] == "b11434-sdist"
    assert body["system_fingerprint"] == "b11434-sdist"
    version = subprocess.run([b11434, "--version"], capture_output=True, text=True, timeout=60)
    assert "(build 11434, commit sdist)" in version.stdout + version.stderr


def older_binary(b11434: Path, folder: Path) -> str:
    """b11434 that says it is b10434 and whose ``--help`` lacks the new option."""
    wrapper = folder / "llama-server-b10434"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case " $* " in\n'
        '  *" --version "*) echo "version: 0.1.0-dev (build 1, commit 7e4c0a9)" >&2; exit 0 ;;\n'
        f'  *" --help "*) "{b11434}" "$@" | grep -v -e "--{NEW_OPTION}"; exit 0 ;;\n'
        "esac\n"
        f'exec "{b11434}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def test_a_binary_without_it_refuses_it_naming_itself(
    b11434: Path, demo_dir: Path, tmp_path: Path
) -> None:
    llama_server = older_binary(b11434, tmp_path)
    ini = preset(tmp_path, demo_dir)
    for args in (
        ["--models-preset", str(ini)],
        ["--models-dir", str(demo_dir), f"--{NEW_OPTION}", "0"],
    ):
        agent = [sys.executable, "-m", "node_agent.cli", "agent"]
        done = subprocess.run(
            [*agent, "--port", str(free_port()), "--llama-server", llama_server, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )
        assert done.returncode != 0
        assert NEW_OPTION in done.stderr
        assert f"llama-server b1-7e4c0a9 ({llama_server})" in done.stderr, done.stderr
