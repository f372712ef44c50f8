"""When things happen in a run: epoch orders, slice bounds, validation and exports, learning rates (no TensorFlow).

Everything here is a function of project.json, the number of training records
and the resume counters, so a resumed run takes the same decisions at the same
places as one that never stopped.

Learning rates (LearningRateSchedule):
    steps          DeepDanbooru's: learning_rates' entry for used_epoch (else learning_rate), set at the
                   start of every slice; an entry with used_fraction f applies from epoch
                   ceil(f * epoch_count)
    warmup_cosine  per minibatch u (used_minibatch before the step), with S = minibatches per epoch:
                   u < W = round(warmup_epochs * S):  learning_rate * (u + 1) / W
                   otherwise:  min + (learning_rate - min) * (1 + cos(pi * (u - W) / (T - W))) / 2,
                   T = epoch_count * S, held at min once u reaches T

epoch_count "fit" (training/fit.py) sets the epoch count of both schedules to the
planned one once a run has measured its speed; until a fresh run has planned,
the cosine has not begun (the rate is learning_rate after the warmup) and no
used_fraction drop is placed. A plan made before a checkpoint moves the drops
from the next slice on, in the run and in one resumed from that checkpoint.

One run keeps one schedule across its plans and stops: a plan that replaces
another changes only how long the rest lasts. The decay's progress p (the
cosine's (u - W) / (T - W), the steps schedule's used_epoch / epoch_count, a
used_fraction drop applying once p reaches its share) goes on from the value
p0 it had reached where the new plan takes over, at unit a (a minibatch, or an
epoch for steps): p = p0 + (1 - p0) (x - a) / (end - a). So after the warmup the
rate only decays and no drop that fell rises again, whatever the new count.
The anchor (a, p0) is kept in every checkpoint with the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from deepdanbooru.project.config import FRACTION_TOLERANCE


def epoch_order(n: int, seed: int, random_seed: int) -> np.ndarray:
    """The shuffled order of an epoch's n training records."""
    return np.random.default_rng([seed, random_seed]).permutation(n)


def validation_trigger(slice_number: int, last: bool, every: int) -> str | None:
    """Whether validation runs after slice `slice_number` (1-based, within the epoch): "epoch", "slice" or None.

    After the epoch's `last` slice always; before it, after every `every`-th slice (0: never mid-epoch).
    """
    if last:
        return "epoch"
    if every and slice_number % every == 0:
        return "slice"
    return None


@dataclass  # not frozen: epoch_count "fit" sets epoch_count to the planned count
class Schedule:
    train_records: int
    slice_records: int  # checkpoint_frequency_mb * minibatch_size
    epoch_count: int
    seed: int
    validation_every: int  # validation_frequency_slices
    export_every: int  # export_model_per_epoch

    @classmethod
    def from_config(cls, config, train_records: int, epoch_count: int | None = None) -> Schedule:
        """epoch_count: the planned count of epoch_count "fit" (None: project.json's number)."""
        return cls(train_records, config.checkpoint_frequency_mb * config.minibatch_size,
                   config.epoch_count if epoch_count is None else epoch_count,
                   config.seed, config.validation_frequency_slices, config.export_model_per_epoch)

    @property
    def slices_per_epoch(self) -> int:
        return -(-self.train_records // self.slice_records)

    def order(self, random_seed: int) -> np.ndarray:
        return epoch_order(self.train_records, self.seed, random_seed)

    def slice_stop(self, offset: int) -> int:
        """The end (exclusive) of the slice that starts at `offset` of the epoch order."""
        return min(offset + self.slice_records, self.train_records)

    def validation_after(self, stop: int) -> str | None:
        """The validation due after the slice ending at `stop`, or None."""
        return validation_trigger(-(-stop // self.slice_records), stop >= self.train_records, self.validation_every)

    def export_due(self, used_epoch: int) -> bool:
        """Whether the epoch that just ended (used_epoch counts it) writes its own export."""
        return self.export_every == 0 or used_epoch % self.export_every == 0

    def exports_after_slice(self, used_epoch: int, offset: int) -> int:
        """The exports that can follow the slice starting at `offset` before a run ends: its epoch's, when
        that slice ends an epoch that exports, and the final one or the one a --time-limit stop writes."""
        ends_epoch = self.slice_stop(offset) >= self.train_records
        return 1 + int(ends_epoch and self.export_due(used_epoch + 1))

    def trained_out(self, used_epoch: int, offset: int) -> bool:
        """All epochs trained: the last checkpoint of a run is its last slice's, before the epoch end."""
        return used_epoch >= self.epoch_count or (used_epoch == self.epoch_count - 1
                                                  and offset >= self.train_records)

    def done_records(self, used_epoch: int, position: int) -> int:
        """Records handed to the model since the first epoch began, `position` into epoch used_epoch."""
        return used_epoch * self.train_records + position

    def validations_per_epoch(self) -> int:
        """The validation passes in one epoch: every validation_every-th slice and the epoch end."""
        slices = self.slices_per_epoch
        return 1 + ((slices - 1) // self.validation_every if self.validation_every else 0)

    def exports_per_epoch(self) -> float:
        """The epoch exports an epoch writes on average (export_model_per_epoch 0: every epoch)."""
        return 1.0 / (self.export_every or 1)


@dataclass  # not frozen: epoch_count "fit" sets epoch_count to the planned count
class LearningRateSchedule:
    config: object  # ProjectConfig
    train_records: int
    # The epochs the cosine spans and used_fraction drops are placed over: None is project.json's epoch_count;
    # "fit" sets the planned count, and math.inf before a fresh run has planned.
    epoch_count: float | None = None
    # (a, p0): from unit a on (a minibatch for warmup_cosine, an epoch for steps) the decay goes on from progress p0
    # over the rest of epoch_count; None: the plain schedule over epoch_count (module docstring).
    anchor: tuple[float, float] | None = None
    # The schedule in force before the last re-plan, for the units before its anchor (this run's earlier steps).
    earlier: "LearningRateSchedule | None" = None

    @property
    def per_minibatch(self) -> bool:
        return self.config.lr_schedule == "warmup_cosine"

    @property
    def minibatches_per_epoch(self) -> int:
        # Slices are whole minibatches except the epoch's last, so an epoch is ceil(records / batch) steps.
        return max(1, -(-self.train_records // self.config.minibatch_size))

    def decay_span(self) -> tuple[float, float]:
        """(start, end) of the decay in its units: the cosine's warmup end and last minibatch, or 0 and the
        epoch count for the steps schedule (end math.inf: not planned yet)."""
        count = self.config.epoch_count if self.epoch_count is None else self.epoch_count
        if not self.per_minibatch:
            return 0, count
        per_epoch = self.minibatches_per_epoch
        total = count * per_epoch
        return min(round(self.config.warmup_epochs * per_epoch), total), total

    def progress(self, unit: float) -> float:
        """How far the decay is at `unit` (0: not begun, 1: done); never lower at a later unit."""
        start, end = self.decay_span()
        if self.anchor is not None:
            where, reached = self.anchor
            if unit < where and self.earlier is not None:
                return self.earlier.progress(unit)
            if end <= where:
                return 1.0
            return min(1.0, reached + (1.0 - reached) * max(0.0, unit - where) / (end - where))
        if math.isinf(end):
            return 0.0
        if unit >= end:
            return 1.0
        return max(0.0, (unit - start) / (end - start))

    def replan(self, epochs: float, used_epoch: int, used_minibatch: int) -> None:
        """Plan `epochs` epochs from here on (before the step at used_minibatch): the decay goes on from where it
        stands. Replacing no plan yet (math.inf) is the plain schedule over `epochs`."""
        start, end = self.decay_span()
        if not math.isinf(end):
            unit = max(used_minibatch if self.per_minibatch else used_epoch, start)
            earlier = LearningRateSchedule(self.config, self.train_records, self.epoch_count, self.anchor,
                                           self.earlier)
            self.anchor, self.earlier = (float(unit), earlier.progress(unit)), earlier
        self.epoch_count = epochs

    def rate(self, used_epoch: int, used_minibatch: int) -> float:
        config = self.config
        if not self.per_minibatch:
            if self.anchor is None:
                return config.learning_rate_for_epoch(used_epoch, self.epoch_count)
            if used_epoch < self.anchor[0] and self.earlier is not None:
                return self.earlier.rate(used_epoch, used_minibatch)
            reached = self.progress(used_epoch)
            rate = config.learning_rate
            for step in config.learning_rates or ():
                share = step.used_fraction
                if (used_epoch >= step.used_epoch) if share is None else reached >= share - FRACTION_TOLERANCE:
                    rate = step.learning_rate
            return rate
        start, end = self.decay_span()
        if used_minibatch < start:
            return config.learning_rate * (used_minibatch + 1) / start
        progress = self.progress(used_minibatch)
        if progress >= 1.0:
            return config.min_learning_rate
        return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) \
            * 0.5 * (1.0 + math.cos(math.pi * progress))
