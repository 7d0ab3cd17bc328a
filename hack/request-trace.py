#!/usr/bin/env python3
"""Which of the agent's modules one request passes through, and how often it crosses between
them (issue 27's "a request's path"): a warm chat and a cold one, with fake children.

    .venv/bin/python hack/request-trace.py [--show]

Every Python call into a ``node_agent`` module while the agent serves the request is
recorded in order (the client and the fake child are not the agent's); a crossing is a call
whose module differs from the previous call's. ``--show`` prints the path itself.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.unit.fake_child import Plan, chat, fake_agent, spec


class Tracer:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("node_agent."):
            self.calls.append(module)

    def crossings(self) -> int:
        return sum(1 for a, b in zip(self.calls, self.calls[1:], strict=False) if a != b)

    def stays(self) -> list[str]:
        """The modules in order, consecutive calls into one module counted once."""
        return [m for i, m in enumerate(self.calls) if i == 0 or self.calls[i - 1] != m]


async def trace(cold: bool) -> Tracer:
    plan = Plan()
    async with fake_agent(plan, [spec("m")]) as agent:
        url = f"{agent.url}/v1/chat/completions"
        if not cold:
            async with agent.client.post(url, json=chat("m")) as response:
                assert response.status == 200
                await response.read()
        tracer = Tracer()
        sys.setprofile(tracer)
        try:
            async with agent.client.post(url, json=chat("m")) as response:
                body = await response.read()
        finally:
            sys.setprofile(None)
        assert response.status == 200, body
        return tracer


def report(name: str, tracer: Tracer, show: bool) -> None:
    stays = tracer.stays()
    print(f"{name}: {len(tracer.calls)} calls, {tracer.crossings()} module crossings, "
          f"{len(set(tracer.calls))} modules")  # fmt: skip
    for module, count in Counter(stays).most_common(6):
        print(f"    entered {count:3d}x  {module}")
    if show:
        print("    path: " + " > ".join(m.removeprefix("node_agent.") for m in stays))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print each request's path")
    args = parser.parse_args()
    report("warm chat", asyncio.run(trace(cold=False)), args.show)
    report("cold chat", asyncio.run(trace(cold=True)), args.show)


if __name__ == "__main__":
    main()
