"""The ``corral`` command: one entry point, a subcommand per job.

``corral agent …`` takes llama-server's router flags (and passes unknown ones to every
child), so it is parsed by :mod:`node_agent.config`, not by argparse here. Subcommands import
their modules lazily: ``corral models`` must not pay for aiohttp's server or kopf.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial

USAGE = """\
usage: corral COMMAND [ARGS...]
       corral --version

commands:
  agent        run the node agent (llama-server router flags; see `corral agent --help`)
  operator     run the ModelPreset operator (Kubernetes)
  demo-models  write tiny generated GGUF models into a folder: corral demo-models DIR [--large]
  llama-server build llama-server for this machine (`build`), or show the one in use (`path`)
  models       list the models of a running agent
  load NAME    load a model on a running agent, with progress
  unload NAME  unload a model on a running agent
  status       show a running agent's models, queue and memory
  ps           the running models: memory, device, time until unload, pin, requests
  logs NAME    a model's llama-server output (-f follows it)
  pull REPO[:QUANT]  download a model from Hugging Face, with a progress bar
  rm NAME      remove a downloaded model and its files
  reload       re-read the models folder, the presets and the Hugging Face cache

The client commands take --url (default http://127.0.0.1:8080) and --api-key, most --json;
`corral COMMAND --help` says more.
"""


EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE, what a shell reports for a program it killed


def _agent(argv: Sequence[str]) -> int:
    # No collection during start-up: what it makes lives as long as the agent, which freezes
    # it once started and turns the collector back on (agent._import_then_freeze).
    gc.disable()
    try:
        from node_agent.binary_probe import BinaryProbe

        # llama-server's --version and --help run while the agent's modules import.
        probe = BinaryProbe(argv, os.environ)
        from node_agent.serve import main

        return main(list(argv), probe)
    finally:
        gc.enable()


def _operator(argv: Sequence[str]) -> int:
    try:
        from preset_operator.main import main
    except ImportError as exc:
        from node_agent.extras import install_hint

        print(f"corral operator: {exc}. {install_hint('operator')}", file=sys.stderr)
        return 2
    return main(list(argv))


def _demo_models(argv: Sequence[str]) -> int:
    from node_agent.demo_models import main

    return main(list(argv))


def _llama_server(argv: Sequence[str]) -> int:
    from node_agent.llama_server.cli import main

    return main(argv)


def _client(argv: Sequence[str]) -> int:
    from node_agent.client import main

    return main(list(argv))


def _client_ops(command: str, argv: Sequence[str]) -> int:
    from node_agent.client_ops import main

    return main([command, *argv])


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "agent": _agent,
    "operator": _operator,
    "demo-models": _demo_models,
    "llama-server": _llama_server,
    "models": lambda argv: _client(["models", *argv]),
    "load": lambda argv: _client(["load", *argv]),
    "unload": lambda argv: _client(["unload", *argv]),
    "status": lambda argv: _client(["status", *argv]),
    **{name: partial(_client_ops, name) for name in ("ps", "logs", "pull", "rm", "reload")},
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    if args[0] == "--version":
        from node_agent.version import version_line

        print(version_line())
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"corral: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    try:
        return command(args[1:])
    except BrokenPipeError:
        # `corral status --json | head`: the reader left, as it may. Say nothing (Python's
        # own flush at exit would print a second traceback: stdout goes to /dev/null), and
        # exit as a program killed by SIGPIPE does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
