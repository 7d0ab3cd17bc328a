"""Per-model environment in a preset: ``env.NAME = value`` keys, and which names may be set.

llama-swap's users pin a model to a GPU with ``CUDA_VISIBLE_DEVICES`` in its environment;
Corral's presets say the same as one INI key per variable::

    [big-model]
    env.CUDA_VISIBLE_DEVICES = 0,1
    env.GGML_CUDA_ENABLE_UNIFIED_MEMORY = 1

One key per variable because a value may hold commas (a device list), and an INI value ends
at the first ``;`` or ``#``: ``env = A=0,1,B=2`` could not be read back. It round-trips:
``GET /models`` shows the same lines in ``status.preset``.

**Which names** (:data:`ALLOWED_ENV`): only device selectors and a few memory switches of
ggml, whoever wrote the preset: the administrator's INI and a ModelPreset's ``spec.env``
alike. An environment variable reaches every library the child loads, and many run code or
touch files: ``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` load a library
of the writer's choice, ggml's own ``GGML_BACKEND_PATH`` loads a backend library,
``GGML_OPENCL_KERNEL_CACHE_DIR`` writes files, ``HOME``/``TMPDIR`` move where it writes, and
``LLAMA_ARG_*`` would set options behind the option checks. So there is no wildcard (not even
``GGML_*``): exact names only, and values restricted to a short device-list alphabet. What is
left gives a ModelPreset nothing its ``args`` could not already do: a ModelPreset may choose its
devices with ``--device``/``--main-gpu``/``--tensor-split`` and its offload with
``--n-gpu-layers``, and the memory switches only change where ggml allocates. So the one list
serves both sources; the operator checks ``spec.env`` with :func:`parse_env_entry` and the CRD
lists the same names and value pattern (``hack/gen-crd-allowlist.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from node_agent.errors import ConfigError

ENV_PREFIX: Final = "env."

# Variables that choose which devices a child sees; a preset that sets one has chosen its
# GPUs itself, so the ledger does not place it (core.placement).
DEVICE_ENV: Final = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",  # NVIDIA CUDA
        "HIP_VISIBLE_DEVICES",  # AMD ROCm/HIP
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "GGML_VK_VISIBLE_DEVICES",  # ggml's Vulkan backend
        "ONEAPI_DEVICE_SELECTOR",  # SYCL
        "ZE_AFFINITY_MASK",  # Level Zero
    }
)
# Memory switches of ggml's GPU backends (read as on/off or small numbers, no paths).
MEMORY_ENV: Final = frozenset(
    {
        "GGML_CUDA_ENABLE_UNIFIED_MEMORY",
        "GGML_CUDA_NO_PINNED",
        "GGML_VK_PREFER_HOST_MEMORY",
        "GGML_VK_ALLOW_SYSMEM_FALLBACK",
        "GGML_VK_FORCE_MAX_ALLOCATION_SIZE",
    }
)
ALLOWED_ENV: Final = DEVICE_ENV | MEMORY_ENV
# Set by the agent for every child (child.spawn): a preset may not change them.
AGENT_ENV: Final = frozenset({"CUDA_DEVICE_ORDER", "LLAMA_SERVER_ROUTER_PORT"})
# Device lists ("0,1", "GPU-1a2b…", "level_zero:0"), switches and sizes: nothing else.
VALUE_PATTERN: Final = r"[A-Za-z0-9,._:-]{0,256}"
_VALUE = re.compile(VALUE_PATTERN)


def parse_env_entry(
    key: str, value: str, where: str, *, path: str | None = None, line: int | None = None
) -> tuple[str, str]:
    """``env.NAME = value`` -> ``(NAME, value)``; ConfigError (what, where, how) otherwise.

    ``where``: the section, for the message; ``path``/``line``: the file's.
    """
    name = key[len(ENV_PREFIX) :]
    if name in AGENT_ENV:
        raise ConfigError(
            f"{key!r} in {where}: {name} is set by Corral for every child", path=path, line=line
        )
    if name not in ALLOWED_ENV:
        allowed = ", ".join(sorted(ALLOWED_ENV))
        raise ConfigError(
            f"{key!r} in {where}: a preset may not set {name or 'an empty name'} in a "
            f"model's environment (only device and memory variables: {allowed}); "
            "give other options as llama-server keys",
            path=path,
            line=line,
        )
    if not _VALUE.fullmatch(value):
        raise ConfigError(
            f"{key!r} in {where}: value {value!r} is not a device list or switch "
            "(letters, digits and , . _ : - only)",
            path=path,
            line=line,
        )
    return name, value


def env_lines(env: Iterable[tuple[str, str]]) -> list[str]:
    """The INI lines that give ``env`` back (``status.preset``)."""
    return [f"{ENV_PREFIX}{name} = {value}" for name, value in sorted(env)]


def pins_device(env: Iterable[tuple[str, str]]) -> bool:
    """Whether a model's environment already chooses its devices."""
    return any(name in DEVICE_ENV for name, _ in env)
