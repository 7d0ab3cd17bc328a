"""A llama-server wrapper that misbehaves on demand, for the agent's fault tests.

The agent runs it as its ``--llama-server`` (through a small shell shim that a test writes, so
no file in the repository needs the executable bit). Each spawn looks up what to do for its
model — the ``--alias NAME`` the agent passes every child — in the JSON file named by
``$CORRAL_FAULTS`` (``{"NAME": "MODE"}``), re-read at every spawn so a test can change a
model's behaviour between loads. ``$CORRAL_FAULT_REAL`` is the real llama-server.

Modes:

- ``pass`` (the default, and ``--version``): exec the real binary; nothing in between.
- ``hang``: say ``loading`` on the protocol, then never become ready, never listen, ignore
  SIGTERM and stdin (a load stuck for good: only the load timeout's SIGKILL ends it).
- ``ignore-exit``: run the real binary underneath, passing its protocol lines through, but
  never let the exit command (stdin) or SIGTERM reach it: a stop must end in SIGKILL of the
  process group.
- ``port-taken-once``: the first spawn of the model (no mark in ``$CORRAL_FAULT_STATE`` yet)
  holds the port it was given while the real binary starts, so the real binary fails with its
  own ``couldn't bind HTTP server socket``; later spawns are ``pass``.
- ``exit:N``: log an error line like llama-server's and exit with code N at once (a crash
  loop).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
LOADING_LINE = (
    'cmd_child_to_router:state:{"state":"loading","payload":{"stages":["text_model"],'
    '"current":"text_model","value":0.0}}'
)


def _mode(argv: list[str]) -> tuple[str, str]:
    alias = argv[argv.index("--alias") + 1] if "--alias" in argv else ""
    plan_file = os.environ.get("CORRAL_FAULTS")
    if not alias or not plan_file or not os.path.exists(plan_file):
        return alias, "pass"
    plan: dict[str, str] = json.loads(Path(plan_file).read_text())
    return alias, plan.get(alias, "pass")


def _exec_real(argv: list[str]) -> None:
    real = os.environ["CORRAL_FAULT_REAL"]
    os.execv(real, [real, *argv])


def _hang() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(LOADING_LINE, flush=True)
    print("fault_server: hanging while loading", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def _die_with_parent() -> None:
    # The real binary underneath must not outlive this wrapper, whoever kills it.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _ignore_exit(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Its stdin is a pipe nobody writes or closes: the exit command never arrives, and no EOF
    # makes it exit either. It stays in this process group, which the agent's SIGKILL takes.
    read_end, write_end = os.pipe()
    real = os.environ["CORRAL_FAULT_REAL"]
    child = subprocess.Popen(
        [real, *argv],
        stdin=read_end,
        stdout=subprocess.PIPE,
        preexec_fn=_die_with_parent,
        # Undo the inherited SIG_IGN, so the real binary behaves as it would on its own.
        restore_signals=True,
    )
    os.close(read_end)
    assert child.stdout is not None
    for line in child.stdout:  # the protocol lines, so the agent sees loading and ready
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
    os.close(write_end)
    return child.wait()


def _port_taken_once(alias: str, argv: list[str]) -> None:
    mark = Path(os.environ["CORRAL_FAULT_STATE"]) / f"{alias}.port-taken"
    if not mark.exists():
        mark.touch()
        port = int(argv[argv.index("--port") + 1])
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        # Inherited through exec, so the port stays taken while the real binary tries it.
        holder.set_inheritable(True)
    _exec_real(argv)


def main(argv: list[str]) -> int:
    if "--version" in argv:
        _exec_real(argv)
    alias, mode = _mode(argv)
    print(f"fault_server: model {alias} mode {mode}", file=sys.stderr, flush=True)
    if mode == "hang":
        _hang()
    if mode == "ignore-exit":
        return _ignore_exit(argv)
    if mode == "port-taken-once":
        _port_taken_once(alias, argv)
    if mode.startswith("exit:"):
        print("0.00.001.000 E fault_server: simulated crash while loading", file=sys.stderr)
        return int(mode.partition(":")[2])
    _exec_real(argv)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
