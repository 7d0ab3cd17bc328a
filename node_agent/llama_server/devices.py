"""What the children compute on: the devices ``llama-server --list-devices`` lists.

llama.cpp lists every device but the CPU (GPUs, and accelerators such as BLAS), or
``(none)``. With none but libraries that compute on the CPU's cores (BLAS), every child
computes on the CPU: the agent gives each a thread per core but one (cpu_threads.py), and
makes the models whose child runs more than one thread take turns (``--cpu-turns``,
core/scheduler.py). Asked at start-up, in a thread beside ``--version`` and ``--help``
(binary_probe.py), once per binary and device selectors (``answers.py``).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

from node_agent.llama_server.answers import Answers, device_selectors

# A CUDA or Vulkan build initialises its drivers to list the devices: seconds, at worst.
LIST_TIMEOUT = 20.0
# llama.cpp's own variable for a child's threads (``-t``): set in the agent's environment,
# every child inherits it.
THREADS_ENV = "LLAMA_ARG_THREADS"
# The options that give a child's generation cores of its own (canonical names): a model with
# one of them shares the CPU as its user chose, and takes no turns. (``-tb`` alone sets the
# prompt's threads: its tokens still take the threads of ``-t``.)
CORE_OPTIONS = ("cpu-mask", "cpu-range")
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


def known_devices(binary: Path, answers: Answers, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """:func:`list_devices`, kept for this binary and the environment's device selectors (a
    ``CUDA_VISIBLE_DEVICES`` of its own is another answer); an answer of None (it could not
    say) is not kept."""
    question = (
        "devices-" + hashlib.sha256(json.dumps(device_selectors(env)).encode()).hexdigest()[:16]
    )
    kept = answers.get(question)
    if isinstance(kept, list) and all(isinstance(d, str) for d in kept):
        return tuple(kept)
    devices = list_devices(binary)
    if devices is not None:
        answers.put(question, list(devices))
    return devices


def threads_given(value: object) -> int | None:
    """The threads a ``-t`` value (or ``LLAMA_ARG_THREADS``) sets, or None for one that sets
    none: llama.cpp takes one below 1 (``-1``, its default) as a thread per core. A value
    that is not a number counts as 2 (several: the child refuses it anyway)."""
    try:
        count = int(str(value).strip())
    except ValueError:
        return 2
    return count if count > 0 else None


def env_threads(env: Mapping[str, str]) -> int | None:
    """The threads ``LLAMA_ARG_THREADS`` gives every child, or None."""
    return threads_given(env.get(THREADS_ENV, "-1"))


def no_turns_because(devices: tuple[str, ...] | None) -> str | None:
    """Why the children would not compute on the CPU alone, or None where they do (a BLAS
    library too computes on its cores): only then do models take turns (``--cpu-turns``)
    and does the agent choose their threads."""
    if devices is None:
        return "llama-server --list-devices did not say what its children compute on"
    gpus = [device for device in devices if device.partition(":")[0] not in CPU_LIBRARIES]
    if gpus:
        return f"the children may compute on {gpus[0].partition(' (')[0]}"
    return None
