"""A build's progress on the terminal: a bar with the step count and the elapsed time.

On a terminal the bar is redrawn in place; in a log (CI, a pipe) a line is written at every
tenth of the build, so a long build never looks hung and never floods the log.
"""

from __future__ import annotations

import time
from typing import TextIO

WIDTH = 30


def elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


class ProgressBar:
    def __init__(self, out: TextIO, label: str) -> None:
        self._out = out
        self._label = label
        self._tty = out.isatty()
        self._start = time.monotonic()
        self._last_tenth = -1
        self._drawn = False

    @property
    def seconds(self) -> float:
        return time.monotonic() - self._start

    def update(self, done: int, total: int) -> None:
        if total <= 0:
            return
        fraction = min(1.0, done / total)
        if self._tty:
            filled = int(fraction * WIDTH)
            bar = "#" * filled + "." * (WIDTH - filled)
            self._out.write(
                f"\r{self._label} [{bar}] {fraction:4.0%} {done}/{total}  {elapsed(self.seconds)}"
            )
            self._drawn = True
        else:
            tenth = int(fraction * 10)
            if tenth == self._last_tenth:
                return
            self._last_tenth = tenth
            self._out.write(
                f"{self._label}: {fraction:.0%} ({done}/{total} steps, "
                f"{elapsed(self.seconds)} elapsed)\n"
            )
        self._out.flush()

    def close(self) -> None:
        if self._drawn:
            self._out.write("\n")
            self._out.flush()
            self._drawn = False
