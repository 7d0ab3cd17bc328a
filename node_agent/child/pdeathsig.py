"""Make a child die with the agent, even when the agent is SIGKILLed (Linux).

llama-server in child mode exits on stdin EOF only once its model is loaded, and not at all
while a request is in flight; ``PR_SET_PDEATHSIG(SIGKILL)`` covers the rest. It is set in the
forked child before exec (``preexec_fn``) and survives exec for non-setuid binaries.

Caveat: the signal fires when the *thread* that forked the child exits, not the process. Spawn
children from a thread that lives as long as the agent (the event loop's thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    # The process's own symbols include libc's: no ctypes.util.find_library, which runs
    # `ldconfig -p` (a child process at every agent start).
    libc = ctypes.CDLL(None, use_errno=True)
    prctl: Callable[..., int] = libc.prctl
    return prctl


# Looked up once in the parent: a forked child of a threaded process should call as little as
# possible before exec (no dlopen, no allocation-heavy work).
_PRCTL: Final = _load_prctl()


def pdeathsig_supported() -> bool:
    return _PRCTL is not None


def make_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that sets the parent-death signal, or None where that is not possible.

    The parent's pid is captured now: if the parent died between fork and prctl the signal
    will never come, so the child checks ``getppid()`` and exits at once in that case.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            # Nothing sensible can be logged from here; carry on without the guard: the
            # stdin-EOF exit and orphan scan still apply.
            return
        if os.getppid() != parent:
            os._exit(1)

    return preexec
