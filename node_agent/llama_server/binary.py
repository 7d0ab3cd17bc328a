"""Finding a llama-server to run, and telling the user plainly when it cannot run here.

Order (SPEC, "The llama-server binary"): ``--llama-server PATH``, ``$LLAMA_SERVER``,
``llama-server`` on ``PATH``, then the best build ``corral llama-server build`` left in the
cache. A path the user named that is unusable is an error, never silently skipped for the next
candidate: they meant that binary.

``check_llama_server`` runs ``--version`` once. A binary built for another CPU (a native build,
a prebuilt one for AVX-512) dies of SIGILL, which we translate into "build one for any CPU
with corral llama-server build".
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from node_agent.errors import BinaryError
from node_agent.llama_server.cache import builds, cache_root
from node_agent.llama_server.plan import LLAMA_CPP_BUILD

ENV_VAR: Final = "LLAMA_SERVER"
NAME: Final = "llama-server"
VERSION_TIMEOUT: Final = 30.0

# Measured: 12 min 40 s on an idle 2-core AMD EPYC (the server, 13 CPU variants, the UI).
BUILD_COMMAND: Final = "corral llama-server build"
HOW_TO_BUILD: Final = (
    f"Build llama.cpp b{LLAMA_CPP_BUILD} for any CPU with `{BUILD_COMMAND}` (once; about "
    f"15 minutes on 2 cores, less with more; cached and found from then on)"
)
HOW_TO_GET: Final = f"{HOW_TO_BUILD}, or point to your own with --llama-server PATH or ${ENV_VAR}."


def _usable(path: Path, origin: str) -> Path:
    if not path.exists():
        raise BinaryError(f"{origin}: {path} does not exist. {HOW_TO_GET}")
    if path.is_dir():
        raise BinaryError(f"{origin}: {path} is a directory, not a llama-server binary.")
    if not os.access(path, os.X_OK):
        raise BinaryError(f"{origin}: {path} is not executable (try `chmod +x {path}`).")
    return path


def built_binary(env: Mapping[str, str]) -> Path | None:
    """The best llama-server ``corral llama-server build`` left in the cache, if any."""
    found = builds(cache_root(env))
    return found[0].binary if found else None


def find_llama_server(explicit: str | None, env: Mapping[str, str]) -> Path:
    """The llama-server to run (absolute), by the documented order. Raises BinaryError."""
    if explicit:
        return _usable(Path(explicit).expanduser().absolute(), "--llama-server")
    from_env = env.get(ENV_VAR)
    if from_env:
        return _usable(Path(from_env).expanduser().absolute(), f"${ENV_VAR}")
    on_path = shutil.which(NAME, path=env.get("PATH", os.defpath))
    if on_path is not None:
        return Path(on_path).absolute()
    built = built_binary(env)
    if built is not None:
        return _usable(built, f"the build in {cache_root(env)}")
    raise BinaryError(
        f"no llama-server found (not given with --llama-server, ${ENV_VAR} unset, none on PATH, "
        f"none built in {cache_root(env)}). {HOW_TO_GET}"
    )


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def explain_exit(returncode: int) -> str | None:
    """Why a llama-server with this exit status could not run here, or None if nothing known.

    Shared with the child supervisor: a binary may pass ``--version`` and still die of SIGILL
    when its CPU backend first computes.
    """
    # A direct child killed by a signal has a negative code; through a shell, 128 + signal.
    if returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        lacks = "" if "avx512f" in _cpu_flags() else " (this CPU has no avx512f)"
        return (
            f"it was killed by SIGILL: an illegal instruction for this CPU{lacks}. It was "
            f"built for another CPU (a native build made elsewhere, or a prebuilt binary for "
            f"AVX-512). {HOW_TO_BUILD}."
        )
    if returncode == 127:
        return "the dynamic loader could not start it (exit 127: a shared library is missing)."
    return None


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def check_llama_server(path: Path | str, *, timeout: float = VERSION_TIMEOUT) -> str:
    """Run ``PATH --version`` once; return its version line, or raise BinaryError saying why not.

    Blocking (up to ``timeout``); call it at start-up or through ``asyncio.to_thread``.
    """
    binary = Path(path)
    try:
        done = subprocess.run(
            [str(binary), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        # execve answers ENOENT both for a missing file and for a missing ELF interpreter.
        if binary.exists():
            raise BinaryError(
                f"{binary} cannot be started: its program loader (ELF interpreter) is missing; "
                f"it was built for another system (e.g. musl vs glibc). {HOW_TO_BUILD}."
            ) from exc
        raise BinaryError(f"{binary} does not exist. {HOW_TO_GET}") from exc
    except PermissionError as exc:
        raise BinaryError(f"{binary} is not executable (try `chmod +x {binary}`).") from exc
    except OSError as exc:  # ENOEXEC: another architecture, or not a program at all
        raise BinaryError(
            f"{binary} cannot be executed on this machine ({exc.strerror}): is it built for "
            f"another CPU architecture? {HOW_TO_BUILD}."
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise BinaryError(f"{binary} --version did not answer within {timeout:g} s.") from exc

    output = (done.stdout + done.stderr).decode(errors="replace")
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if done.returncode != 0:
        loader = next((line for line in lines if "error while loading shared" in line), None)
        if loader is not None:
            raise BinaryError(
                f"{binary} cannot start: {loader}. Use the libraries it was built with "
                f"(LD_LIBRARY_PATH), or {HOW_TO_BUILD[0].lower()}{HOW_TO_BUILD[1:]}."
            )
        reason = explain_exit(done.returncode)
        if reason is None:
            how = (
                f"was killed by {_signal_name(done.returncode)}"
                if done.returncode < 0
                else f"exited with code {done.returncode}"
            )
            last = f": {lines[-1]}" if lines else ""
            reason = f"it {how}{last}"
        raise BinaryError(f"{binary} --version failed: {reason}")
    # llama-server prints "version: 0.1.0-dev (build 1, commit 7e4c0a9)" on stderr.
    for line in lines:
        if line.startswith("version:"):
            return line.removeprefix("version:").strip()
    if not lines:
        raise BinaryError(f"{binary} --version printed nothing: is it a llama-server?")
    return lines[0]


_BUILD = re.compile(r"\(build (\d+), commit ([0-9A-Za-z]+)\)")


def build_info(version: str) -> str:
    """llama.cpp's ``build_info`` (``b<build>-<commit>``, as its ``/props`` says) from a
    ``--version`` line: ``0.1.0-dev (build 1, commit 7e4c0a9)`` -> ``b1-7e4c0a9``; the line
    itself where it has no build number."""
    m = _BUILD.search(version)
    return f"b{m.group(1)}-{m.group(2)}" if m else version


# The binary the agent runs, once chosen (``BinaryProbe.result``): what its children can do
# depends on it, and the estimator needs one fact of it (``has_amx_kernels``).
_in_use: Path | None = None


def set_in_use(binary: Path) -> None:
    global _in_use
    _in_use = binary


def has_amx_kernels() -> bool:
    """Whether the llama-server in use has ggml's AMX kernels (which copy weights into an AMX
    buffer on CPUs with AMX). A build with its CPU variants beside it has them only in the
    variant with AMX tiles, which ``corral llama-server build`` leaves out; a build with one
    CPU backend has them where it was built for AMX: assumed so (the estimate errs high)."""
    return True if _in_use is None else _folder_has_amx_kernels(_in_use.parent)


@functools.cache  # asked at every estimate (a range is some twenty): the folder is read once
def _folder_has_amx_kernels(folder: Path) -> bool:
    variants = [p.name for p in folder.glob("libggml-cpu-*")]
    return not variants or any("sapphirerapids" in name for name in variants)
