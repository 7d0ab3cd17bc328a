"""Run ``corral agent`` with a census of its asyncio tasks on SIGUSR1, for the soak's leak check.

``python tests/integration/task_census.py agent [OPTIONS]`` is ``corral agent [OPTIONS]``;
on SIGUSR1 it writes the names of its live tasks, as a JSON list, to ``$CORRAL_TASK_CENSUS``.
The agent has no debug endpoint for this, and a soak must look at the very process it loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from node_agent.cli import main


def _census(signum: int, frame: FrameType | None) -> None:
    # Python runs signal handlers in the main thread, which is the one running the agent's
    # loop: the running loop is visible from here.
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        names: list[str] = []
    else:
        names = sorted(task.get_name() for task in asyncio.all_tasks(loop) if not task.done())
    target = Path(os.environ["CORRAL_TASK_CENSUS"])
    partial = target.with_suffix(".part")
    partial.write_text(json.dumps(names))
    partial.replace(target)  # the reader never sees half a file


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _census)
    sys.exit(main(sys.argv[1:]))
