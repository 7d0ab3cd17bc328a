"""What a llama-server binary answered at an earlier start, kept so that a start asks it nothing
it already knows (issue 49: ``--version``, ``--help`` and ``--list-devices`` cost a start three
child processes, some 0.1-0.3 s, and a GPU build's ``--list-devices`` starts its drivers).

An answer is kept under the binary's identity: the path, size and modification time of the
binary and of the shared libraries beside it (llama.cpp's code is in them: a rebuild or an
update replaces them), and the machine's boot (``/proc/sys/kernel/random/boot_id``): a home
folder moved to another machine, or a new GPU or driver, comes with a reboot, and a binary built
for one CPU may not run on the next. What it lists as devices depends on the environment's
device selectors too (``CUDA_VISIBLE_DEVICES`` and the like), which that answer's key includes.

Each answer is one small file in ``$XDG_CACHE_HOME/corral/llama-server-answers``, written
whole under another name and renamed: a reader sees an answer or none. A file that cannot be
read as one is no answer (the binary is asked again); a failure is never kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, TypeVar

from node_agent.llama_server.cache import cache_root

BOOT_ID: Final = Path("/proc/sys/kernel/random/boot_id")
# Environment variables that choose the devices a binary sees (CUDA's, ROCm's, Vulkan's,
# SYCL's): ``--list-devices`` answers differently under each.
DEVICE_VARIABLES: Final = ("_VISIBLE_DEVICES", "ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK")
# The most a kept answer may hold (a --help is ~40 KB): a larger file is none.
MAX_ANSWER: Final = 1 << 20

T = TypeVar("T")


def answers_root(env: Mapping[str, str]) -> Path:
    return cache_root(env).parent / "llama-server-answers"


def identity(binary: Path) -> list[tuple[str, int, int]]:
    """The binary and the shared libraries in its folder: path, size, modification time."""
    resolved = binary.resolve()
    files = [resolved]
    with contextlib.suppress(OSError):
        with os.scandir(resolved.parent) as entries:
            names = sorted(e.name for e in entries if ".so" in e.name or e.name.endswith(".dylib"))
        files += [resolved.parent / name for name in names]
    out = []
    for path in files:
        with contextlib.suppress(OSError):
            st = path.stat()
            out.append((str(path), st.st_size, st.st_mtime_ns))
    return out


def _boot() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""  # not Linux: the binary's identity alone


def device_selectors(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.endswith(DEVICE_VARIABLES)}


class Answers:
    """One binary's kept answers (see the module's docstring)."""

    def __init__(self, binary: Path, env: Mapping[str, str]) -> None:
        self._folder = answers_root(env)
        seed = json.dumps([identity(binary), _boot()])
        self._key = hashlib.sha256(seed.encode()).hexdigest()[:32]

    def _path(self, question: str) -> Path:
        return self._folder / f"{self._key}-{question}.json"

    def get(self, question: str) -> object:
        """The kept answer, or :data:`NONE` where there is none (or it cannot be read)."""
        path = self._path(question)
        try:
            with path.open("rb") as file:
                data = file.read(MAX_ANSWER + 1)
            if len(data) > MAX_ANSWER:
                return NONE
            document = json.loads(data)
        except (OSError, ValueError):
            return NONE
        if not isinstance(document, dict) or "answer" not in document:
            return NONE
        return document["answer"]

    def put(self, question: str, answer: object) -> None:
        """Keep ``answer`` (JSON); a cache that cannot be written is no error (asked again)."""
        with contextlib.suppress(OSError, TypeError, ValueError):
            self._folder.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"answer": answer}).encode()
            fd, temporary = tempfile.mkstemp(dir=self._folder, prefix=".answer-")
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(data)
                os.replace(temporary, self._path(question))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

    def remembered(self, question: str, ask: Callable[[], T], valid: Callable[[object], bool]) -> T:
        """The kept answer to ``question`` where it is ``valid``, else ``ask()`` (kept when it
        returns; an exception passes on, and nothing is kept)."""
        kept = self.get(question)
        if kept is not NONE and valid(kept):
            return kept  # type: ignore[return-value]  # (``valid`` checked its type)
        answer = ask()
        self.put(question, answer)
        return answer


NONE: Final = object()  # no kept answer
