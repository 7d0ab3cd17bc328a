"""The one line a client reads when a load fails: what failed, why, and what to do.

llama.cpp's router answers ``model name=X failed to load`` and nothing more. That is all the
openai SDK and chat front ends show, so the cause sat where nobody looked (``error.corral``,
``/ui``, the next request): issue 29. Corral keeps llama.cpp's words first, for clients that
match on them, and goes on with the cause and a next step, in one line.
"""

from __future__ import annotations

import re
from typing import Final

from node_agent.clip import clip

# The most of a reason the message repeats (the child's log line in it is up to 4 KB): the
# whole reason stays in ``error.corral.reason`` and the model's log.
REASON_SHOWN: Final = 600

# llama.cpp's timestamp and level before the child's line ("0.00.063.483 E "): noise here.
_LOG_PREFIX: Final = re.compile(r"last log line: \d+(?:\.\d+)+ [A-Z] +")

# What to do, by what the reason says; the first that matches wins. Matched on the clipped
# reason only (bounded work, whatever a child printed).
_ADVICE: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    # ChildProcess's own words for a load that took too long.
    (
        re.compile(r"load_timeout="),
        "if the model needs longer, start the agent with a larger --load-timeout",
    ),
    # explain_exit already says how to get a binary for this CPU.
    (re.compile(r"SIGILL"), ""),
    (
        re.compile(
            r"gguf_init|invalid magic|error loading model|not within the file bounds"
            r"|failed to (open|read)|No such file",
            re.IGNORECASE,
        ),
        "check the model file: a partial download or a copy cut short fails this way; "
        "download or copy it again",
    ),
    (
        re.compile(r"out of memory|failed to allocate|cannot allocate|OOM", re.IGNORECASE),
        "free memory, or give it a smaller context (-c) or a smaller quantization",
    ),
    (
        re.compile(r"download", re.IGNORECASE),
        "check the repository name and the network (HF_TOKEN for a gated repository)",
    ),
)


def failure_message(name: str, reason: str) -> str:
    """``model name=X failed to load: WHY; WHAT TO DO; its log: …`` (llama.cpp's message
    alone when there is no reason)."""
    head = f"model name={name} failed to load"
    why = reason.strip()
    if not why:
        return head
    # The child's reasons start with "model X: "; the head says it already.
    why = clip(why.removeprefix(f"model {name}: "), REASON_SHOWN)
    why = _LOG_PREFIX.sub("last log line: ", why, count=1)
    parts = [f"{head}: {why}"]
    for pattern, advice in _ADVICE:
        if pattern.search(why):
            if advice:
                parts.append(advice)
            break
    parts.append(f"its log: corral logs {name} (GET /models/logs?model={name})")
    # One line: a reason that carried a newline would split the client's one-line message.
    return "; ".join(parts).replace("\n", " ")
