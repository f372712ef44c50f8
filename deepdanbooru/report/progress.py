"""A carriage-return progress bar on a terminal; on anything else, a line at each quarter."""

from __future__ import annotations

import sys
import time


class Bar:
    WIDTH = 30
    INTERVAL = 0.2

    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total = label, max(int(total), 1)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last = 0.0
        self._quarter = 0

    def update(self, done: int) -> None:
        fraction = min(done / self.total, 1.0)
        if self.tty:
            now = time.monotonic()
            if now - self._last < self.INTERVAL and done < self.total:
                return
            self._last = now
            filled = int(self.WIDTH * fraction)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {done}/{self.total}")
        else:
            quarter = int(fraction * 4)
            if quarter <= self._quarter:
                return
            self._quarter = quarter
            self.stream.write(f"{self.label}: {done}/{self.total}\n")
        self.stream.flush()

    def close(self) -> float:
        """Clears the bar; the seconds since it started."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        return time.monotonic() - self.start
