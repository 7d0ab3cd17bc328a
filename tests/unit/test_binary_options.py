"""The option table of the binary in use: its own --help, not only the pinned binary's table."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.binary_probe import BinaryProbe
from node_agent.config import llama_server_arg, parse_agent_args
from node_agent.errors import BinaryError, ConfigError
from node_agent.llama_server import binary
from node_agent.sources import options
from node_agent.sources.options import generated_options, llama_options, use_options_of
from node_agent.sources.preset_ini import parse_preset_text

# Two options in llama.cpp's --help layout (the option column is padded to 40), one of them
# (--spec-future) unknown to the pinned binary.
HELP = """\
----- common params -----

-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from
                                        model)
                                        (env: LLAMA_ARG_CTX_SIZE)
--spec-future N                         an option of a newer llama-server (default: 3)
                                        (env: LLAMA_ARG_SPEC_FUTURE)
"""
VERSION = "0.6.0-dev (build 11434, commit abc1234)"
REPO = Path(__file__).resolve().parents[2]


def fake_binary(path: Path, help_text: str) -> Path:
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{help_text}EOF\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def restore_table() -> Iterator[None]:
    yield
    options._in_use = None


def test_the_binarys_own_options_are_used(tmp_path: Path) -> None:
    table = use_options_of(fake_binary(tmp_path / "llama-server", HELP), VERSION)
    assert llama_options() is table
    assert table.key("spec-future") is not None
    assert generated_options().key("spec-future") is None
    assert table.origin == f"llama-server b11434-abc1234 ({tmp_path / 'llama-server'})"
    # the agent's flags and the presets both go by it
    parsed = parse_agent_args(["--spec-future", "5"], {})
    assert dict(parsed.child_options) == {"spec-future": "5"}
    assert parse_preset_text("[m]\nspec-future = 4\n", "p.ini")


def test_an_option_this_binary_lacks_is_refused_naming_the_binary(tmp_path: Path) -> None:
    use_options_of(fake_binary(tmp_path / "llama-server", HELP), VERSION)
    with pytest.raises(ConfigError, match=r"--swa-full: .*llama-server b11434-abc1234"):
        parse_agent_args(["--swa-full"], {})
    with pytest.raises(ConfigError, match=r"'swa-full' .*llama-server b11434-abc1234"):
        parse_preset_text("[m]\nswa-full = true\n", "p.ini")


def test_a_replaced_binary_is_read_again(tmp_path: Path) -> None:
    path = fake_binary(tmp_path / "llama-server", HELP)
    assert use_options_of(path, VERSION).key("spec-future") is not None
    fake_binary(path, HELP.replace("--spec-future", "--spec-later "))
    os.utime(path, ns=(1, 1))  # a different mtime even within the file system's resolution
    table = use_options_of(path, VERSION)
    assert table.key("spec-later") is not None and table.key("spec-future") is None


def test_an_unreadable_help_falls_back_to_the_generated_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        table = use_options_of(broken, VERSION)
    assert table is generated_options()
    assert "cannot read the options of" in caplog.text and "built-in table" in caplog.text


def test_the_early_probe_gives_the_version_and_puts_the_binarys_options_in_use(
    tmp_path: Path,
) -> None:
    """``cli`` begins the checks before the agent's modules import (start-up time)."""
    path = tmp_path / "llama-server"
    path.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "version: {VERSION}" >&2; exit 0; }}\n'
        '[ "$1" = --list-devices ] && { printf "Available devices:\\n  (none)\\n"; exit 0; }\n'
        f"cat <<'EOF'\n{HELP}EOF\n"
    )
    path.chmod(0o755)
    probe = BinaryProbe(["-c", "1", "--llama-server", str(path)], {})
    assert probe.result() == (path, VERSION, None)
    assert llama_options().key("spec-future") is not None
    assert probe.devices() == ()  # the CPU alone


def test_the_early_probe_does_not_wait_for_the_devices_before_the_flags(tmp_path: Path) -> None:
    """``--list-devices`` starts a GPU build's drivers (seconds): ``--help``, ``--version`` and
    a bad flag, answered once :meth:`BinaryProbe.result` returns, exit without waiting for
    it; the agent itself waits for them (:meth:`BinaryProbe.devices`)."""
    path = tmp_path / "llama-server"
    path.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "version: {VERSION}" >&2; exit 0; }}\n'
        '[ "$1" = --list-devices ] && { sleep 2; printf "Available devices:\\n  (none)\\n"; '
        "exit 0; }\n"
        f"cat <<'EOF'\n{HELP}EOF\n"
    )
    path.chmod(0o755)
    probe = f"BinaryProbe(['--llama-server', {str(path)!r}], {{}})"
    for then, bound in (("result()[1]", (0.0, 1.5)), ("devices()", (2.0, 10.0))):
        script = f"from node_agent.binary_probe import BinaryProbe\nprint({probe}.{then})"
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert bound[0] <= time.monotonic() - began < bound[1], (then, done.stdout)
    assert done.stdout == "()\n"  # the CPU alone


def test_the_early_probe_keeps_the_error_for_later(tmp_path: Path) -> None:
    """No binary, or one whose --version fails: the error waits (``--help`` still works) and
    the generated table stays in use."""
    gone = str(tmp_path / "nope")
    binary, version, missing = BinaryProbe(["--llama-server", gone], {}).result()
    assert (binary, version) == (None, "")
    assert isinstance(missing, BinaryError) and "does not exist" in str(missing)
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    binary, version, missing = BinaryProbe(["--llama-server", str(broken)], {}).result()
    assert (binary, version) == (broken, "")
    assert isinstance(missing, BinaryError) and "exited with code 3" in str(missing)
    assert llama_options() is generated_options()
    assert BinaryProbe(["--llama-server", gone], {}).devices() is None


def test_the_llama_server_flag_is_found_before_parsing() -> None:
    assert llama_server_arg(["-c", "1", "--llama-server", "/x/ls"]) == "/x/ls"
    assert llama_server_arg(["--llama-server=/y"]) == "/y"
    assert llama_server_arg(["-c", "1"]) is None


@pytest.mark.parametrize(
    ("line", "info"),
    [
        ("0.1.0-dev (build 1, commit 7e4c0a9)", "b1-7e4c0a9"),
        ("0.6.0-dev (build 0, commit unknown)", "b0-unknown"),
        ("something else", "something else"),
    ],
)
def test_build_info(line: str, info: str) -> None:
    assert binary.build_info(line) == info
