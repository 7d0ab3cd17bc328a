"""The registry's refusals, in llama.cpp's error shape with Corral's extras."""

from __future__ import annotations

import math

from node_agent.errors import ApiError
from node_agent.runtime.load_failure import failure_message


def failed_error(name: str, reason: str) -> ApiError:
    """llama.cpp's 500 for a failed load, its message followed by why and what to do
    (:func:`~node_agent.runtime.load_failure.failure_message`); the reason alone stays as
    Corral's extra."""
    detail = {"reason": reason} if reason else None
    return ApiError(500, failure_message(name, reason), detail=detail)


def backoff_error(name: str, reason: str, retry_after: float) -> ApiError:
    """503 with Retry-After for a model in crash-loop backoff (no load is tried meanwhile)."""
    seconds = max(1, math.ceil(retry_after))
    why = f" (last error: {reason})" if reason else ""
    return ApiError(
        503,
        f"model name={name} keeps failing to load{why}; next attempt in {seconds} s",
        headers={"Retry-After": str(seconds)},
    )


def queue_full_error(name: str, max_queue: int) -> ApiError:
    """``--max-queue``: 503 at once instead of joining a queue that is full."""
    return ApiError(
        503,
        f"too many requests are waiting for model '{name}' (--max-queue {max_queue}); "
        "try again later",
        headers={"Retry-After": "1"},
    )


def queue_timeout_error(name: str, timeout: float, reason: str) -> ApiError:
    """``--queue-timeout``: 503 for a request that waited its turn that long, saying what it
    waited for (the scheduler's :meth:`~node_agent.core.scheduler.Scheduler.wait_reason`)."""
    return ApiError(
        503,
        f"model '{name}' did not become available within the queue timeout ({timeout:g} s): "
        f"{reason}; try again later",
        headers={"Retry-After": str(max(1, math.ceil(timeout)))},
    )


# A client told to come back after a shutdown reaches the pod's replacement (or this agent
# restarted) a moment later.
CLOSING_RETRY_AFTER = 1


def closing_error() -> ApiError:
    """503 for a request that arrives while the agent shuts down (on a kept-alive connection:
    new connections are no longer accepted)."""
    return ApiError(
        503,
        "the agent is shutting down; try again later",
        headers={"Retry-After": str(CLOSING_RETRY_AFTER)},
    )
