"""When things happen in a run: epoch orders, slice bounds, validation and exports (no TensorFlow).

Everything here is a function of project.json, the number of training records
and the resume counters, so a resumed run takes the same decisions at the same
places as one that never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


@dataclass(frozen=True)
class Schedule:
    train_records: int
    slice_records: int  # checkpoint_frequency_mb * minibatch_size
    epoch_count: int
    seed: int
    validation_every: int  # validation_frequency_slices
    export_every: int  # export_model_per_epoch

    @classmethod
    def from_config(cls, config, train_records: int) -> Schedule:
        return cls(train_records, config.checkpoint_frequency_mb * config.minibatch_size, config.epoch_count,
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

    def trained_out(self, used_epoch: int, offset: int) -> bool:
        """All epochs trained: the last checkpoint of a run is its last slice's, before the epoch end."""
        return used_epoch >= self.epoch_count or (used_epoch == self.epoch_count - 1
                                                  and offset >= self.train_records)

    def done_records(self, used_epoch: int, position: int) -> int:
        """Records handed to the model since the first epoch began, `position` into epoch used_epoch."""
        return used_epoch * self.train_records + position
