"""train-project --time-limit: the duration, and whether one more slice still fits before it.

Standard library only: the CLI parses the limit before TensorFlow starts.

A run stops only at a slice end, where a checkpoint has just been written,
so a later run continues exactly where this one left off. Before each slice
the loop asks `another_slice_fits`: the time left must hold the longest
slice seen so far (its validation and checkpoint included), the exports that
follow it, and a margin. Nothing is measured before the first slice, so a run
always trains at least one. The one wait inside a slice that may never end,
for a batch from the tf.data service, gives up at `deadline` with one line.
"""

from __future__ import annotations

import re
import time

from deepdanbooru.errors import TrainingError

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_UNITS = (3600.0, 60.0, 1.0)

# Kept free at the end for what is not measured: closing files, leaving the process, clock noise.
MARGIN_SHARE = 0.01
MARGIN_SECONDS = 10.0
# Before the first export is measured: an export writes the weights a checkpoint also writes, as a zip.
EXPORT_PER_CHECKPOINT = 2.0


def parse_duration(text: str) -> float:
    """'3h50m', '90m', '900s', '1.5h' -> seconds; anything else is one TrainingError line."""
    cleaned = str(text).strip().lower().replace(" ", "")
    match = _DURATION.fullmatch(cleaned)
    if not cleaned or match is None or not any(match.groups()):
        raise TrainingError(f"--time-limit: {text!r} is not a duration; write it as hours, minutes and seconds "
                            "with units, e.g. 3h50m, 90m or 900s")
    seconds = sum(float(value) * unit for value, unit in zip(match.groups(), _UNITS) if value)
    if seconds <= 0:
        raise TrainingError(f"--time-limit: {text!r} must be longer than 0 seconds")
    return seconds


class TimeBudget:
    """The wall-clock limit of one train-project run, counted from its construction."""

    def __init__(self, seconds: float, text: str | None = None, clock=time.monotonic):
        self.seconds = float(seconds)
        self.text = text or f"{seconds:g}s"
        self.clock = clock
        self.started = clock()
        self.longest_slice = None
        self.longest_checkpoint = 0.0
        self.longest_validation = 0.0
        self.longest_export = None
        # The most recent of each, for planning (training/fit.py): the longest is usually the first, which
        # carries tracing and compiling, and would plan every later one as slow as that.
        self.recent_checkpoint = self.recent_validation = self.recent_export = None
        # Validations the run's last export adds to an ordinary one's (wise_ft tries one a mixing weight).
        self.final_validations = 0

    @property
    def margin(self) -> float:
        return MARGIN_SHARE * self.seconds + MARGIN_SECONDS

    @property
    def deadline(self) -> float:
        """The clock reading by which a wait inside a slice must give up: the limit less the margin."""
        return self.started + self.seconds - self.margin

    def elapsed(self) -> float:
        return self.clock() - self.started

    def slice_took(self, seconds: float) -> None:
        self.longest_slice = max(seconds, self.longest_slice or 0.0)

    def checkpoint_took(self, seconds: float) -> None:
        self.longest_checkpoint = max(seconds, self.longest_checkpoint)
        self.recent_checkpoint = seconds

    def validation_took(self, seconds: float) -> None:
        self.longest_validation = max(seconds, self.longest_validation)
        self.recent_validation = seconds

    def export_took(self, seconds: float) -> None:
        """An export's time, including the validation it ran for its sidecar files, if it ran one."""
        self.longest_export = max(seconds, self.longest_export or 0.0)
        self.recent_export = seconds

    def export_estimate(self) -> float:
        if self.longest_export is not None:
            return self.longest_export
        # An export may validate first (when the last slice did not), for the thresholds beside it.
        return EXPORT_PER_CHECKPOINT * self.longest_checkpoint + self.longest_validation

    def final_extra(self) -> float:
        """Seconds the last export takes beyond an ordinary one (wise_ft's validations), at the pace of the latest
        validation: the first, which also traces and compiles, would reserve several times what they take."""
        return self.final_validations * (self.recent_validation or self.longest_validation)

    def needed(self, exports: int) -> float:
        """Seconds one more slice and then `exports` exports take (the last one the run's last), margin
        included (0 before any slice)."""
        if self.longest_slice is None:
            return 0.0
        return self.longest_slice + exports * self.export_estimate() + self.final_extra() + self.margin

    def another_slice_fits(self, exports: int) -> bool:
        """Whether a slice followed by `exports` exports ends before the limit (always, before the first)."""
        return self.longest_slice is None or self.elapsed() + self.needed(exports) <= self.seconds

    def too_small_notice(self, config_path) -> str | None:
        """When even one slice and its export do not fit in the limit: what to change."""
        if self.longest_slice is None or self.needed(1) <= self.seconds:
            return None
        return (f"notice: one slice and an export take about {self.needed(1) - self.margin:.0f} s, more than the "
                f"{max(self.seconds - self.margin, 0):.0f} s --time-limit {self.text} leaves after its safety margin "
                f"of {self.margin:.0f} s; every run trains at least one slice, so lower checkpoint_frequency_mb in "
                f"{config_path} or raise the limit")
