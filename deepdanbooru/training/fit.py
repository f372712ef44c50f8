"""epoch_count "fit": how many epochs a --time-limit run has room for, from the speed it measures (no TensorFlow).

A run plans at the end of its first slice, before that slice's checkpoint,
and again at the end of its second, so each checkpoint holds the plan the
slices after it train with (training/fit_monitor.py keeps it there) and a run
resumed from any checkpoint goes on with it. A resumed run trains its first
slice on the plan of the checkpoint it resumed from, then plans again from its
own --time-limit: the epochs already done plus those the time left holds.

What one epoch costs, in seconds:

    train_records / samples per second      the first plan: the steps of this run's first slice, from the
                                            end of its first step on (that one carries tracing and the
                                            start of the input pipeline; a slice of one step is timed
                                            whole); the second: the second slice from its start (the
                                            input's start included, no tracing) to its last step
  + slices per epoch x checkpoint           the last checkpoint this run wrote; before the first one,
                                            the time the resumed checkpoint took to read (a fresh run: 0)
  + validations per epoch x validation      the last one this run timed; before the first, as long as
                                            training on as many records (a forward pass costs less)
  + exports per epoch x export              the last export timed; before the first, two checkpoints
                                            and a validation

The last of each, not the longest: the first validation and export of a run
trace (and under XLA compile) their functions, which took 3.9 s against 1.0 s
for each later validation of a ViT fine-tune on 1,000 posts, so planning from
the longest planned its 3.9-second epochs at 6.5 s and ended the run at half
its time limit.

The plan: the epochs done (the one in progress as a fraction) plus (the time
left - this slice's checkpoint - the final export - the budget's margin) / the
epoch's cost, rounded down; never fewer than the epoch in progress needs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class EpochCosts:
    samples_per_second: float
    checkpoint: float
    validation: float
    export: float

    def epoch_seconds(self, schedule, validation_records: int) -> float:
        """What one epoch of `schedule` (training.schedule.Schedule) takes, its checkpoints and outputs included."""
        validations = schedule.validations_per_epoch() if validation_records else 0
        return (schedule.train_records / self.samples_per_second + schedule.slices_per_epoch * self.checkpoint
                + validations * self.validation + schedule.exports_per_epoch() * self.export)


def plan_epochs(done: float, seconds_left: float, epoch_seconds: float) -> int:
    """The epoch count to plan: `done` (epochs, a fraction for the one in progress) plus those `seconds_left`
    holds at `epoch_seconds` each, rounded down; at least the epoch in progress, and at least one."""
    more = max(seconds_left, 0.0) / epoch_seconds
    return max(math.floor(done + more + 1e-9), math.ceil(done - 1e-9), 1)


class StepClock:
    """The speed of a slice's steps, from the end of its first step (or from its start) to the end of its last."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.begin(0)

    def begin(self, position: int) -> None:
        """The run starts `position` records into its epoch (before tracing: a fallback for a one-step slice)."""
        self.start = (self.clock(), position)
        self.first = self.last = None

    def step(self, position: int) -> None:
        """A step ended with `position` records of the epoch handed to the model."""
        self.last = (self.clock(), position)
        if self.first is None:
            self.first = self.last

    def samples_per_second(self, whole_slice: bool = False) -> float | None:
        """From the end of the first step; `whole_slice`: from begin() (a slice without tracing)."""
        if self.last is None:
            return None
        since = self.first if self.last[1] > self.first[1] and not whole_slice else self.start
        seconds, samples = self.last[0] - since[0], self.last[1] - since[1]
        return samples / seconds if seconds > 0 and samples > 0 else None


def plan_line(epochs: int, done: float, costs: EpochCosts, epoch_seconds: float, limit_text: str,
              before: int | None, second: bool = False) -> str:
    """What the run prints when it has planned, e.g. 'epoch_count fit: 12 epochs planned in 6m at 48 samples/s'."""
    line = f"epoch_count fit: {epochs} epochs planned in {limit_text} at {costs.samples_per_second:.3g} samples/s"
    line += f" (an epoch about {epoch_seconds:.3g} s"
    if second:
        line += "; planned again from the second slice, its input's start and a checkpoint timed"
    if before:
        line += f"; {done:.2f} done, {before} planned when the run resumed"
    return line + ")"
