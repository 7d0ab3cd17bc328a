"""Summarise py-spy's collapsed stacks (``CORRAL_BENCH_PYSPY``): where the agent's time goes.

    python -m bench.profile_summary DIR/S1-12345.folded.txt [--top 25]

Prints the functions with the most samples on top of the stack (self) and anywhere in it
(inclusive), as shares of all samples. Idle samples (the event loop waiting in select/epoll)
are counted apart, so the shares are of the time the agent was busy.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

# Frames that mean "waiting for I/O": the event loop's poll. Samples ending in them are idle.
IDLE = ("select (selectors.py", "poll (selectors.py", "_run_once (asyncio/base_events.py")


def summarise(text: str, top: int) -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = idle = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if frames[-1].startswith(IDLE):
            idle += count
            continue
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not busy:
        return f"no busy samples ({idle} idle)"
    lines = [f"samples: {busy} busy, {idle} idle ({busy / max(1, busy + idle):.0%} busy)", ""]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"top {top} by {title} share of busy samples:")
        for frame, count in counter.most_common(top):
            lines.append(f"  {count / busy:6.1%}  {frame}")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    print(summarise(args.path.read_text(errors="replace"), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
