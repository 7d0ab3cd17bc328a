"""What a child is started with: its configuration, environment and command line."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

from node_agent.child.keys import keyed_environment
from node_agent.child.launched import Launched, launch
from node_agent.child.orphans import tag_environment
from node_agent.child.pdeathsig import make_preexec, pdeathsig_supported
from node_agent.child.ports import CHILD_HOST
from node_agent.errors import ChildError, ConfigError

# Chosen by the supervisor for every child; a model's arguments may not set them.
RESERVED_ARGS: Final = frozenset({"--host", "--port"})
# The agent runs its MCP servers itself: a child that read these from the inherited
# environment would start every one of them again (llama.cpp's children do).
AGENT_ONLY_ENV: Final = frozenset(
    {
        "LLAMA_ARG_MCP_SERVERS_CONFIG",
        "LLAMA_ARG_MCP_SERVERS_JSON",
        "LLAMA_ARG_UI_MCP_PROXY",
        "LLAMA_ARG_TOOLS",
        "LLAMA_ARG_TOOLS_RUNTIME",
        "LLAMA_ARG_AGENT",
    }
)


@dataclass(frozen=True)
class ChildConfig:
    """How to run one model. ``args`` are llama-server options, without --host/--port."""

    name: str
    binary: Path
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stop_timeout: float = 10.0
    load_timeout: float = 600.0
    log_lines: int = 1000
    agent_tag: str | None = None  # CORRAL_AGENT_TAG for the orphan scan; None: untagged
    router_port: int = 0  # value of LLAMA_SERVER_ROUTER_PORT (the agent's port where known)
    port_attempts: int = 5

    def __post_init__(self) -> None:
        for arg in self.args:
            flag = arg.split("=", 1)[0]
            if flag in RESERVED_ARGS:
                raise ConfigError(
                    f"model {self.name}: {flag} is chosen by Corral for each child "
                    "(127.0.0.1 and a free port); remove it from the model's arguments"
                )
        if self.stop_timeout < 0 or self.load_timeout <= 0 or self.port_attempts < 1:
            raise ConfigError(
                f"model {self.name}: stop_timeout must be >= 0, load_timeout > 0 and "
                "port_attempts >= 1"
            )


def child_environment(
    config: ChildConfig, base: Mapping[str, str] | None = None, *, port: int = 0
) -> dict[str, str]:
    """The agent's environment, then the model's ``env``, then what the supervisor needs
    (the child's own API key among it: ``child.keys``)."""
    env = dict(os.environ if base is None else base)
    # Google Cloud's AIP_MODE would make a child take the agent's AIP_HTTP_PORT (b11434's
    # router passes it on, and none of its children loads): Vertex is the agent's business.
    env.pop("AIP_MODE", None)
    for name in AGENT_ONLY_ENV:
        env.pop(name, None)
    env.update(config.env)
    # Its presence turns llama.cpp's parent–child protocol on; the pinned binary ignores the
    # value (llama.cpp's router passes its own port, so we do too where we know it).
    env["LLAMA_SERVER_ROUTER_PORT"] = str(config.router_port)
    # So that CUDA's device indices agree with NVML's, which the memory ledger reads (SPEC).
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if config.agent_tag is not None:
        env.update(tag_environment(config.agent_tag))
    return keyed_environment(env, port)


def child_argv(config: ChildConfig, port: int) -> list[str]:
    return [str(config.binary), *config.args, "--host", CHILD_HOST, "--port", str(port)]


# util-linux's setpriv sets the parent-death signal and execs the child: the same guard as a
# preexec_fn, without one. A preexec_fn forces Python's slow fork path (3 ms and a blocked
# event loop per spawn, measured) where posix_spawn/vfork takes 0.3 ms.
SETPRIV: Final = shutil.which("setpriv")


@dataclass(frozen=True)
class Spawned:
    """A started child (stdin and stdout piped) and the read end of its stderr, a pipe of
    our own that the reader can pause (``ChildProcess._pump_stderr``)."""

    process: Launched
    stderr: BinaryIO


def spawn(config: ChildConfig, port: int) -> Spawned:
    """Start the child with all three pipes, in a process group of its own within the agent's
    session (``child/launched.py`` says why), dying with its parent."""
    argv = child_argv(config, port)
    preexec = None
    if SETPRIV is not None and pdeathsig_supported():
        argv = [SETPRIV, "--pdeathsig", "KILL", "--", *argv]
    else:
        preexec = make_preexec()
    read_end, write_end = os.pipe()
    try:
        process = launch(argv, child_environment(config, port=port), write_end, preexec)
    except BaseException as exc:
        os.close(read_end)
        if isinstance(exc, OSError):
            raise ChildError(
                f"model {config.name}: cannot run {config.binary}: {exc.strerror or exc}"
            ) from exc
        raise
    finally:
        os.close(write_end)  # the child's copy is its own: the pipe ends when the child does
    return Spawned(process, os.fdopen(read_end, "rb", buffering=0))
