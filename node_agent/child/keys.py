"""Each child's own API key, which only this agent knows: the agent is the only way in.

A child listens on 127.0.0.1, where any local user can reach it; with the agent's own
``--api-key`` the agent was guarded and its children were not (issue 16, row 12), and with
``LLAMA_API_KEY`` in the agent's environment instead the children inherited the agent's key (a
second behaviour). Now every child is started with ``LLAMA_API_KEY`` set to a key derived from
a secret drawn when the agent starts and the child's port (so the proxy needs nothing but the
port it already has); the agent's own key never reaches a child, and the proxy sends the child's
key in place of whatever the client sent. ``/health`` stays open, as llama-server keeps it.

The key goes through the environment, not the command line: ``/proc/PID/cmdline`` is readable by
every local user, ``/proc/PID/environ`` only by the child's own user.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets

# Drawn once per agent process: a restarted agent's keys are new, and the orphans a killed
# agent left (ended at the next start anyway) cannot be reached with them.
_SECRET = secrets.token_bytes(32)

# The environment names of llama-server's key options; the agent's own values never pass on.
KEY_ENV = "LLAMA_API_KEY"
KEY_FILE_ENV = "LLAMA_ARG_API_KEY_FILE"


@functools.lru_cache(maxsize=1024)  # asked for every proxied request (an HMAC each: issue 30)
def child_key(port: int) -> str:
    """The API key of the child listening on ``port``."""
    return hmac.new(_SECRET, f"child:{port}".encode(), hashlib.sha256).hexdigest()


def keyed_environment(env: dict[str, str], port: int) -> dict[str, str]:
    """``env`` with the child's own key in place of any the agent was given."""
    env.pop(KEY_FILE_ENV, None)
    env[KEY_ENV] = child_key(port)
    return env
