"""What ``--tools`` and ``--tools-runtime`` may say, checked when the command line is parsed.

llama.cpp's ``server_tools::setup`` and ``make_tools_runtime`` (``server-tools.cpp``): an
unknown tool name or a runtime it cannot use ends the server at start. A runtime names an
isolate the tools run in: ``docker:<image>``/``podman:<image>`` (a container the agent starts
and removes), ``docker-container:<id>``/``podman-container:<id>`` (one that exists) or
``ssh:<target>``. A client's ``X-Tool-Runtime`` header may name only the agent's own runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOL_NAMES = (
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
)
ALL = "all"
ENGINES = ("docker", "podman")
SSH_PREFIX = "ssh:"
# A value that starts with '-' would become an option of docker or ssh (``--privileged``,
# ``-oProxyCommand=…``, which runs a program on the host): llama.cpp's character sets.
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")


class RuntimeSpecError(ValueError):
    """A runtime that cannot be used; the message is llama.cpp's."""


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    engine: str  # docker or podman (the same verbs and argument order)
    arg: str  # the image to start, or the id of the container to use
    attach: bool  # True: ``<engine>-container:<id>``, a container that already runs


def split_tool_names(raw: str) -> list[str]:
    """``--tools``' value as llama.cpp reads it (``parse_csv_row``: commas, "double quotes")."""
    fields: list[str] = []
    field = ""
    quoted = False
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == '"':
            if quoted and raw[i + 1 : i + 2] == '"':
                field += '"'
                i += 1
            elif quoted:
                quoted = False
            elif field:
                field += '"'  # a quote inside an unquoted field is a character
            else:
                quoted = True
        elif ch == "," and not quoted:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    fields.append(field)
    return fields


def check_tool_names(names: list[str]) -> tuple[str, ...]:
    """The tools to enable, in llama.cpp's order; raises ValueError naming the valid ones."""
    for name in names:
        if name != ALL and name not in TOOL_NAMES:
            raise ValueError(
                f'unknown tool "{name}". available tools: {", ".join(TOOL_NAMES)} (or {ALL})'
            )
    return tuple(t for t in TOOL_NAMES if t in names or ALL in names)


def container_spec(spec: str) -> ContainerSpec | None:
    for engine in ENGINES:
        for prefix, attach in ((f"{engine}-container:", True), (f"{engine}:", False)):
            if spec.startswith(prefix):
                return ContainerSpec(engine, spec[len(prefix) :], attach)
    return None


def valid_container_id(value: str) -> bool:
    return _CONTAINER_ID.fullmatch(value) is not None


def valid_ssh_target(value: str) -> bool:
    return _SSH_TARGET.fullmatch(value) is not None


def check_attachable(runtime: str) -> ContainerSpec | str:
    """A runtime a tool call can run in (``make_tools_io``): a running container, or an ssh
    target. Raises RuntimeSpecError with llama.cpp's message."""
    container = container_spec(runtime)
    if container is not None:
        if not container.attach:
            raise RuntimeSpecError(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(container.arg):
            raise RuntimeSpecError(f"invalid container id: {container.arg}")
        return container
    if runtime.startswith(SSH_PREFIX):
        target = runtime[len(SSH_PREFIX) :]
        if not valid_ssh_target(target):
            raise RuntimeSpecError(f"invalid ssh target: {target}")
        return target
    # Never the host instead: the caller asked for an isolate.
    raise RuntimeSpecError(f"unknown tool runtime: {runtime}")


def check_tools_runtime(spec: str) -> str:
    """``--tools-runtime``: an image to start, or an isolate that exists (checked now)."""
    container = container_spec(spec)
    if container is not None and not container.attach:
        if not container.arg:
            raise RuntimeSpecError(
                f"--tools-runtime {container.engine}:<image> requires an image name"
            )
        return spec
    check_attachable(spec)
    return spec
