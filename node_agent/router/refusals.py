"""The registry's refusals, in llama.cpp's error shape with Corral's extras."""

from __future__ import annotations

import math

from node_agent.errors import ApiError


def failed_error(name: str, reason: str) -> ApiError:
    """llama.cpp's 500 for a failed load, with why (the child's own error line) as Corral's
    extra."""
    detail = {"reason": reason} if reason else None
    return ApiError(500, f"model name={name} failed to load", detail=detail)


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


def queue_timeout_error(name: str, timeout: float) -> ApiError:
    """``--queue-timeout``: 503 for a request that waited its turn that long."""
    return ApiError(
        503,
        f"model '{name}' did not become available within the queue timeout ({timeout:g} s); "
        "try again later",
        headers={"Retry-After": str(max(1, math.ceil(timeout)))},
    )
