"""What the children compute on: the devices ``llama-server --list-devices`` lists.

llama.cpp lists every device but the CPU (GPUs, and accelerators such as BLAS), or
``(none)``. With none but libraries that compute on the CPU's cores (BLAS), every child
computes on the CPU, with a thread per core by default, and the agent makes models take
turns (``--cpu-turns``, core/scheduler.py). Asked once, at start-up, in a thread beside
``--version`` and ``--help`` (binary_probe.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

# A CUDA or Vulkan build initialises its drivers to list the devices: seconds, at worst.
LIST_TIMEOUT = 20.0
# llama.cpp's own variable for a child's threads (``-t``): set in the agent's environment,
# every child inherits it.
THREADS_ENV = "LLAMA_ARG_THREADS"
# The options that give a child its threads or its cores (canonical names): a model with one
# of them shares the CPU as its user chose, and takes no turns.
THREAD_OPTIONS = ("threads", "threads-batch", "cpu-mask", "cpu-range", "cpu-mask-batch",
                  "cpu-range-batch")  # fmt: skip
# Devices llama.cpp lists that compute on the CPU's own cores (ggml's BLAS and ZenDNN backends,
# "accelerators" to ggml): a CPU build with one still runs a thread per core in each child.
CPU_LIBRARIES = frozenset({"BLAS", "ZenDNN"})


def parse_devices(text: str) -> tuple[str, ...] | None:
    """The devices of a ``--list-devices`` output (``()``: the CPU only), or None when the
    output is not one (an older or another binary)."""
    lines = text.splitlines()
    try:
        start = lines.index("Available devices:")
    except ValueError:
        return None
    listed = [line.strip() for line in lines[start + 1 :] if line.startswith("  ")]
    if listed == ["(none)"]:
        return ()
    return tuple(listed) or None


def list_devices(binary: Path, *, timeout: float = LIST_TIMEOUT) -> tuple[str, ...] | None:
    """Run ``binary --list-devices``; its devices, or None when it could not say."""
    try:
        done = subprocess.run(
            [str(binary), "--list-devices"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_devices(done.stdout) if done.returncode == 0 else None


def cpu_turn(seconds: float, devices: tuple[str, ...] | None, env: Mapping[str, str]) -> float:
    """How long a model computing on the CPU may hold the others back (``--cpu-turns``): the
    flag's value where the children compute on the CPU alone (a BLAS library too computes on
    its cores), each with a thread per core; 0 (no turns) where they have a GPU, where the
    binary could not say, and where the agent's environment gives every child its threads
    (``LLAMA_ARG_THREADS``)."""
    if devices is None or env.get(THREADS_ENV):
        return 0.0
    if any(device.partition(":")[0] not in CPU_LIBRARIES for device in devices):
        return 0.0
    return seconds
