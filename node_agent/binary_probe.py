"""The llama-server binary's three start-up checks, begun before the agent's modules import.

``corral agent`` runs the binary twice before it can parse its own flags: ``--version``
(does it run on this machine?) and ``--help`` (which options it has); and once to learn what
its children compute on (``--list-devices``: the CPU alone, or GPUs too); a binary's answers
are kept from one start to the next (``llama_server/answers.py``). Begun here, from
``cli``, the children run while the interpreter imports aiohttp and the agent (a few
hundred ms), instead of after: the agent listens sooner (bench S6, start with 1,000 models).
Only what finding the binary needs is imported first.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from node_agent.config import llama_server_arg
from node_agent.errors import BinaryError
from node_agent.llama_server.answers import Answers
from node_agent.llama_server.binary import check_llama_server, find_llama_server, set_in_use
from node_agent.llama_server.devices import known_devices
from node_agent.sources.options import read_options_early, use_options_of


class BinaryProbe:
    """Find the binary now; run its ``--version``, ``--help`` and ``--list-devices`` in three
    threads."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="binary-probe")
        self._binary: Path | None = None
        self._help: Future[None] | None = None
        self._version: Future[str] | None = None
        self._devices: Future[tuple[str, ...] | None] | None = None
        self._missing: BinaryError | None = None
        try:
            self._binary = find_llama_server(llama_server_arg(argv), env)
        except BinaryError as exc:
            self._missing = exc
            return
        # What the binary answered at an earlier start is kept (llama_server/answers.py): a
        # start that knows it asks nothing.
        answers = Answers(self._binary, env)
        self._help = self._pool.submit(read_options_early, self._binary, answers)
        self._version = self._pool.submit(_version, self._binary, answers)
        self._pool.shutdown(wait=False)  # its threads end with their checks
        # A daemon thread: a GPU build starts its drivers to list its devices (seconds), and
        # ``--help`` or a bad flag answers and exits without waiting for them.
        self._devices = Future()
        threading.Thread(
            target=_list_devices_into,
            args=(self._devices, self._binary, answers, dict(env)),
            name="binary-probe-devices",
            daemon=True,
        ).start()

    def result(self) -> tuple[Path | None, str, BinaryError | None]:
        """``(binary, its version line, None)`` once ``--version`` and ``--help`` are done,
        that binary's options then in use; ``(…, "", error)`` when there is no usable binary.
        Not ``--list-devices``: only the agent itself waits for it (:meth:`devices`)."""
        if self._binary is None or self._help is None or self._version is None:
            return None, "", self._missing
        self._help.exception()  # waits: a failure is left for use_options_of
        try:
            version = self._version.result()
        except BinaryError as exc:
            return self._binary, "", exc
        use_options_of(self._binary, version)
        set_in_use(self._binary)
        return self._binary, version, None

    def devices(self) -> tuple[str, ...] | None:
        """The devices besides the CPU its children may compute on (``()``: the CPU alone),
        None when the binary could not say; once :meth:`result` found a usable binary."""
        return None if self._devices is None else self._devices.result()


def _version(binary: Path, answers: Answers) -> str:
    return answers.remembered("version", lambda: check_llama_server(binary), _a_line)


def _a_line(answer: object) -> bool:
    return isinstance(answer, str) and bool(answer)


def _list_devices_into(
    future: Future[tuple[str, ...] | None], binary: Path, answers: Answers, env: dict[str, str]
) -> None:
    try:
        future.set_result(known_devices(binary, answers, env))
    except BaseException as exc:  # a thread's boundary: the agent's wait sees it
        future.set_exception(exc)
