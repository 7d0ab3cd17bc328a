"""Finding llama-server, and the messages that say why one cannot run (fake executables)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from node_agent.errors import BinaryError
from node_agent.llama_server.binary import check_llama_server, find_llama_server
from node_agent.llama_server.plan import STAMP


def script(path: Path, body: str, *, executable: bool = True) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755 if executable else 0o644)
    return path


def cached_build(cache: Path, key: str, llama_cpp: int, backends: list[str]) -> Path:
    """A finished ``corral llama-server build`` under ``cache`` ($XDG_CACHE_HOME)."""
    folder = cache / "corral" / "llama-server" / key
    folder.mkdir(parents=True)
    stamp = {"llama_cpp": llama_cpp, "backends": backends}
    (folder / STAMP).write_text(json.dumps(stamp))
    return script(folder / "llama-server", f"echo {key}")


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    """One fake llama-server per place it may be found."""
    found = {}
    for where in ("explicit", "env", "path"):
        folder = tmp_path / where
        folder.mkdir()
        found[where] = script(folder / "llama-server", f"echo {where}")
    found["cache"] = cached_build(tmp_path / "xdg", "b11434-cpu", 11434, ["cpu"])
    return found


class TestFind:
    def test_order_explicit_env_path_cache(self, bins: dict[str, Path], tmp_path: Path) -> None:
        env = {
            "LLAMA_SERVER": str(bins["env"]),
            "PATH": str(bins["path"].parent),
            "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        }
        assert find_llama_server(str(bins["explicit"]), env) == bins["explicit"]
        assert find_llama_server(None, env) == bins["env"]
        del env["LLAMA_SERVER"]
        assert find_llama_server(None, env) == bins["path"]
        env["PATH"] = "/nonexistent"
        assert find_llama_server(None, env) == bins["cache"]

    def test_the_cache_prefers_the_newest_build_then_more_backends(self, tmp_path: Path) -> None:
        xdg = tmp_path / "xdg"
        cached_build(xdg, "b11000-cpu-cuda", 11000, ["cpu", "cuda"])
        cpu = cached_build(xdg, "b11434-cpu", 11434, ["cpu"])
        env = {"PATH": "/nonexistent", "XDG_CACHE_HOME": str(xdg)}
        assert find_llama_server(None, env) == cpu
        cuda = cached_build(xdg, "b11434-cpu-cuda-sm90", 11434, ["cpu", "cuda"])
        assert find_llama_server(None, env) == cuda

    def test_an_unfinished_build_in_the_cache_is_not_used(self, tmp_path: Path) -> None:
        # A build interrupted before its stamp was written: the binary may be half-linked.
        folder = tmp_path / "xdg" / "corral" / "llama-server" / "b11434-cpu"
        folder.mkdir(parents=True)
        script(folder / "llama-server", "true")
        env = {"PATH": "/nonexistent", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
        with pytest.raises(BinaryError, match="no llama-server found"):
            find_llama_server(None, env)

    def test_an_empty_variable_counts_as_unset(self, bins: dict[str, Path]) -> None:
        env = {"LLAMA_SERVER": "", "PATH": str(bins["path"].parent)}
        assert find_llama_server("", env) == bins["path"]

    def test_relative_paths_become_absolute(
        self, bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(bins["explicit"].parent)
        found = find_llama_server("./llama-server", {})
        assert found.is_absolute() and found.samefile(bins["explicit"])

    def test_nothing_found_says_how_to_get_one(self, tmp_path: Path) -> None:
        env = {"PATH": "/nonexistent", "XDG_CACHE_HOME": str(tmp_path)}
        with pytest.raises(BinaryError) as raised:
            find_llama_server(None, env)
        message = str(raised.value)
        assert "no llama-server found" in message
        assert "`corral llama-server build`" in message and "15 minutes" in message
        assert "--llama-server PATH" in message

    def test_a_named_binary_that_is_missing_is_an_error_not_skipped(
        self, bins: dict[str, Path], tmp_path: Path
    ) -> None:
        env = {"PATH": str(bins["path"].parent)}
        with pytest.raises(BinaryError, match=r"--llama-server: .* does not exist"):
            find_llama_server(str(tmp_path / "nope"), env)
        env["LLAMA_SERVER"] = str(tmp_path / "nope")
        with pytest.raises(BinaryError, match=r"\$LLAMA_SERVER: .* does not exist"):
            find_llama_server(None, env)

    def test_not_executable_or_a_directory(self, tmp_path: Path) -> None:
        plain = script(tmp_path / "llama-server", "true", executable=False)
        with pytest.raises(BinaryError, match=r"not executable.*chmod"):
            find_llama_server(str(plain), {})
        with pytest.raises(BinaryError, match="is a directory"):
            find_llama_server(str(tmp_path), {})


class TestCheck:
    def test_returns_the_version_line(self, tmp_path: Path) -> None:
        fake = script(
            tmp_path / "llama-server",
            'echo "version: 0.1.0-dev (build 1, commit 7e4c0a9)" >&2\n'
            'echo "built with GNU 11.4.0 for Linux x86_64" >&2',
        )
        assert check_llama_server(fake) == "0.1.0-dev (build 1, commit 7e4c0a9)"

    @pytest.mark.parametrize("body", ["kill -ILL $$", "exit 132"])
    def test_sigill_means_it_was_built_for_another_cpu(self, tmp_path: Path, body: str) -> None:
        # Killed directly (-4), or through a wrapper shell (128 + 4).
        fake = script(tmp_path / "llama-server", body)
        with pytest.raises(BinaryError) as raised:
            check_llama_server(fake)
        message = str(raised.value)
        assert "SIGILL" in message and "built for another CPU" in message
        assert "`corral llama-server build`" in message

    def test_missing_shared_library_quotes_the_loader(self, tmp_path: Path) -> None:
        loader = (
            "llama-server: error while loading shared libraries: libggml.so.0: "
            "cannot open shared object file: No such file or directory"
        )
        fake = script(tmp_path / "llama-server", f'echo "{loader}" >&2\nexit 127')
        with pytest.raises(BinaryError) as raised:
            check_llama_server(fake)
        assert "libggml.so.0: cannot open shared object file" in str(raised.value)
        assert "LD_LIBRARY_PATH" in str(raised.value)

    def test_exit_127_without_a_loader_line(self, tmp_path: Path) -> None:
        fake = script(tmp_path / "llama-server", "exit 127")
        with pytest.raises(BinaryError, match="shared library is missing"):
            check_llama_server(fake)

    def test_not_executable(self, tmp_path: Path) -> None:
        fake = script(tmp_path / "llama-server", "true", executable=False)
        with pytest.raises(BinaryError, match="not executable"):
            check_llama_server(fake)

    def test_missing(self, tmp_path: Path) -> None:
        with pytest.raises(BinaryError, match=r"does not exist.*`corral llama-server build`"):
            check_llama_server(tmp_path / "nope")

    def test_missing_interpreter(self, tmp_path: Path) -> None:
        # execve answers ENOENT, as for an ELF binary whose loader is not on this system.
        fake = tmp_path / "llama-server"
        fake.write_text("#!/nonexistent/ld-linux.so\n")
        fake.chmod(0o755)
        with pytest.raises(BinaryError, match="program loader"):
            check_llama_server(fake)

    def test_not_a_program_for_this_machine(self, tmp_path: Path) -> None:
        fake = tmp_path / "llama-server"
        fake.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57)  # a truncated ELF header
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        with pytest.raises(BinaryError, match="cannot be executed on this machine"):
            check_llama_server(fake)

    def test_other_failures_show_the_last_line(self, tmp_path: Path) -> None:
        fake = script(tmp_path / "llama-server", 'echo "error: unknown argument" >&2\nexit 2')
        with pytest.raises(BinaryError, match="exited with code 2: error: unknown argument"):
            check_llama_server(fake)
        fake = script(tmp_path / "llama-server", "kill -SEGV $$")
        with pytest.raises(BinaryError, match="killed by SIGSEGV"):
            check_llama_server(fake)

    def test_silence_and_hangs(self, tmp_path: Path) -> None:
        with pytest.raises(BinaryError, match="printed nothing"):
            check_llama_server(script(tmp_path / "quiet", "true"))
        with pytest.raises(BinaryError, match=r"did not answer within 0\.05 s"):
            check_llama_server(script(tmp_path / "slow", "exec sleep 5"), timeout=0.05)
