"""llama.cpp's parent–child protocol, as llama-server speaks it (b10434 and b11434 alike).

A llama-server started with ``LLAMA_SERVER_ROUTER_PORT`` in its environment keeps its stdout for
the protocol and writes its logs to stderr. Verified with llama.cpp b10434 and b11434, a 0.5 MB
model loads like this on stdout::

    cmd_child_to_router:state:{"state":"loading","payload":{"stages":["text_model"],
                               "current":"text_model","value":0.0}}
    cmd_child_to_router:state:{"state":"loading","payload":{...,"value":1.0}}
    cmd_child_to_router:state:{"state":"ready","payload":{"id":"tiny.gguf","aliases":[...],
                               "object":"model","owned_by":"llamacpp","meta":{"n_ctx":256,...}}}

then ``"sleeping"`` (payload null) and ``"ready"`` again on wake. The other way, the line
``cmd_router_to_child:exit`` on the child's stdin asks it to exit (exit code 0); once loaded, it
also exits when its stdin reaches EOF (exit code 1). Other states that llama.cpp defines
(``downloading``, ``measuring``) belong to child roles Corral does not spawn; they parse fine.

Pure parsing: no I/O here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

from node_agent.errors import ChildError

STATE_PREFIX: Final = "cmd_child_to_router:state:"
EXIT_COMMAND: Final = b"cmd_router_to_child:exit\n"

LOADING: Final = "loading"
READY: Final = "ready"
SLEEPING: Final = "sleeping"


class ProtocolError(ChildError):
    """A line that starts like a state line but does not carry a valid state."""


@dataclass(frozen=True)
class StateLine:
    """One ``cmd_child_to_router:state:{json}`` line."""

    state: str
    payload: Any

    @property
    def progress(self) -> float | None:
        """Loading progress in 0..1 (``payload.value``), or None where the line has none."""
        if self.state != LOADING or not isinstance(self.payload, dict):
            return None
        value = self.payload.get("value")
        # bool is an int subclass: a `true` is not a progress figure.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value):
            return None
        return min(1.0, max(0.0, float(value)))


def parse_state_line(line: str) -> StateLine | None:
    """Parse one stdout line of a child (without or with its line ending).

    Returns None for a line that is not a state line (a binary that does not reserve its
    stdout may print anything there). Raises ProtocolError for a state line whose JSON is
    broken or has no ``state`` string: the caller decides whether that is fatal.
    """
    text = line.rstrip("\r\n")
    if not text.startswith(STATE_PREFIX):
        return None
    body = text[len(STATE_PREFIX) :]
    try:
        message = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"malformed state line from child: {body[:200]!r}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("state"), str):
        raise ProtocolError(f"state line without a state: {body[:200]!r}")
    return StateLine(state=message["state"], payload=message.get("payload"))
