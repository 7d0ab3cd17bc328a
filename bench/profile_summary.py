"""Summarise py-spy's collapsed stacks (``CORRAL_BENCH_PYSPY``): where the agent's time goes.

    python -m bench.profile_summary DIR/S1-12345.folded.txt [--top 25]

Prints the functions with the most samples on top of the stack (self) and anywhere in it
(inclusive), as shares of the busy samples: those of the event loop waiting in epoll are
counted apart as idle.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path


def _is_idle(frame: str) -> bool:
    """The event loop waiting in epoll/select: py-spy can report it as active (the thread is
    in a system call, not sleeping), so it is recognised here and counted apart."""
    function, _, where = frame.partition(" (")
    return where.startswith("selectors.py") and function.rsplit(".", 1)[-1] in {"select", "poll"}


def summarise(text: str, top: int, under: str = "") -> str:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = idle = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        if under and not any(under in frame for frame in frames):
            continue
        if _is_idle(frames[-1]):
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
    parser.add_argument(
        "--under",
        default="",
        help="only samples with a frame containing this text, e.g. 'Handle._run' for the "
        "event loop's callbacks (leaves out start-up imports)",
    )
    args = parser.parse_args(argv)
    print(summarise(args.path.read_text(errors="replace"), args.top, args.under))
    return 0


if __name__ == "__main__":
    sys.exit(main())
