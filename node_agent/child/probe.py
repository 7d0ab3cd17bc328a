"""The probe of a suspect child: is it broken, or were its requests' failures their own?

The scheduler suspects a child whose request stalled, or whose requests failed in a row with
5xx of its own (``core.scheduler.Scheduler._judge``). Neither proves much: b11434 answers 500
to requests that are only their client's mistake (any exception in a handler but
``std::invalid_argument`` is ``ERROR_TYPE_SERVER``: an image for a text-only model, an unknown
token to ``/detokenize``), and a long answer that is not streamed sends no byte while it
computes. So the child is asked what any healthy llama-server answers, whatever the clients
sent:

1. ``GET /slots``: a high-priority task of the child's main loop (b11434,
   ``server-context.cpp``), answered between two batches however busy its slots are. No
   answer within the bound: the loop is stuck (a wedge that ``/health``, answered by the HTTP
   thread, never shows).
2. A one-token completion: a 5xx here is the child's own, since the request is the agent's.
   No answer within the bound, while ``/slots`` answered, is a child busy serving others.

Only a positive failure is "broken": a false verdict of broken would let a client's requests
kill a child under another client's, so where the child cannot show its loop (``--no-slots``
answers 501 at once) a probe that times out says nothing.
"""

from __future__ import annotations

import aiohttp

from node_agent.child.keys import child_key
from node_agent.child.ports import CHILD_HOST

# The agent's own request: short, uncached, one token whatever the model.
COMPLETION = {"prompt": "Hello", "n_predict": 1, "cache_prompt": False}
NOT_SUPPORTED = 501  # b11434's answer for what the child was not started for: deliberate


async def probe_child(port: int, bound: float) -> str | None:
    """Probe the child on ``port``, each step bounded by ``bound`` seconds: None when it
    answered as a healthy child does, else how it failed (for the log and ``GET /models``)."""
    base = f"http://{CHILD_HOST}:{port}"
    headers = {"Authorization": f"Bearer {child_key(port)}"}
    timeout = aiohttp.ClientTimeout(total=bound)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.get(f"{base}/slots", headers=headers) as answer:
                slots = answer.status
        except TimeoutError:
            return f"its main loop answered no GET /slots within {bound:g}s"
        except aiohttp.ClientError as exc:
            return f"GET /slots failed: {exc}"
        if _broken(slots):
            return f"GET /slots answered {slots}"
        try:
            async with session.post(
                f"{base}/completion", json=COMPLETION, headers=headers
            ) as answer:
                completion = answer.status
        except TimeoutError:
            return None  # its loop answered: busy with others' requests, not broken
        except aiohttp.ClientError as exc:
            return f"a one-token completion failed: {exc}"
        if _broken(completion):
            return f"a one-token completion of the agent's own answered {completion} too"
        return None


def _broken(status: int) -> bool:
    return status >= 500 and status != NOT_SUPPORTED
