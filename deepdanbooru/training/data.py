"""Each slice's input for the strategy in use, with the bad-image accounting for it.

One process (one device or MirroredStrategy): the slice's global batches go
through `experimental_distribute_dataset`, which splits each over the local
replicas.

Several workers: every worker walks the same epoch order and builds, with
`distribute_datasets_from_function`, a dataset of only its part of each
global batch. Global batch k of a slice is the records at offsets
[k*B, (k+1)*B), B = minibatch_size; it is cut into one part of B / replicas
records per replica, in replica order, and worker w reads (and decodes) only
the parts of its own replicas. Without unreadable images the batches are
therefore exactly those of a single process; an unreadable record makes its
worker's later batches refill from its own next records. When one worker
runs out before another, TensorFlow gives it empty batches for the steps
left, which the loss (averaged over the real global count) and synchronized
batch normalization handle.

Bad images are found per worker (the gaps in the positions it received),
summed over the workers so every worker takes the same stop-or-go decision,
and logged by the chief alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.pipeline import BadImageTracker, TrainingInput, training_dataset
from deepdanbooru.pipeline.service import ServiceErrors
from deepdanbooru.pipeline.gaps import PositionGaps
from deepdanbooru.runstate.cluster import ClusterRole


class EpochPaths:
    """paths[position] of the epoch order, without materialising a list per epoch."""

    def __init__(self, paths, order: np.ndarray):
        self._paths = paths
        self._order = order

    def __getitem__(self, position: int) -> str:
        return self._paths[int(self._order[position])]

    def __len__(self) -> int:
        return len(self._order)


@dataclass(frozen=True)
class Epoch:
    """One epoch's training records in their shuffled order; its slices read order[start:stop]."""

    paths: list
    tag_strings: list
    tags: list
    order: np.ndarray
    number: int  # 1-based, as the bad-image log names it
    random_seed: int
    bad_image_log: Path
    # A pipeline.packed.ShardReader when the project is packed: the same records, read from the shards.
    shards: object | None = None

    def records(self, positions) -> tuple[list, list]:
        """(paths, tag strings) of the records at these epoch positions."""
        indices = self.order[positions]
        return [self.paths[i] for i in indices], [self.tag_strings[i] for i in indices]

    def tracker(self, max_image_pixels: int) -> BadImageTracker:
        return BadImageTracker(self.bad_image_log, EpochPaths(self.paths, self.order),
                               max_image_pixels=max_image_pixels, context=f"epoch {self.number}",
                               diagnose_path=self.shards.diagnose if self.shards else None)


def shard_offsets(count: int, batch_size: int, workers: int, worker: int) -> np.ndarray:
    """Offsets in a slice of `count` records that `worker` reads: its part of every global batch."""
    share = batch_size // workers
    offsets = np.arange(count, dtype=np.int64)
    return offsets[(offsets % batch_size) // share == worker]


class WholeSlice:
    """A slice read by this process alone: `observe` each batch's positions, then `finish` for the bad count."""

    def __init__(self, strategy, epoch: Epoch, options: TrainingInput, start: int, stop: int):
        self.start, self.count = start, stop - start
        self.tracker = epoch.tracker(options.max_image_pixels)
        paths, tag_strings = epoch.records(np.arange(start, stop))
        self.dataset = strategy.experimental_distribute_dataset(training_dataset(
            paths, tag_strings, epoch.tags, options, random_seed=epoch.random_seed, start_position=start,
            shards=epoch.shards))
        if options.data_service:
            self.dataset = ServiceErrors(self.dataset)

    def observe(self, local_positions) -> None:
        # One tensor per local replica; positions live on the host, so this does not wait for the step.
        for positions in local_positions:
            self.tracker.observe(np.asarray(positions))

    def finish(self) -> int:
        return self.tracker.finish(self.start, self.count)

    @property
    def bad_entries(self) -> list:
        """(position, path, reason) of the pictures `finish` found bad."""
        return self.tracker.last_bad


class ShardedSlice:
    """WholeSlice's interface for one worker's shard of a slice in a cluster."""

    def __init__(self, strategy, role: ClusterRole, sums, epoch: Epoch, options: TrainingInput, start: int,
                 stop: int):
        self.role, self.sums, self.epoch, self.options = role, sums, epoch, options
        self.start, self.count = start, stop - start
        self.expected = np.zeros(0, np.int64)
        self.gaps = PositionGaps()
        self.bad_entries: list = []  # (position, path, reason) of the bad pictures, on the chief (which logs them)

        def dataset(context):
            positions = start + shard_offsets(self.count, options.batch_size, context.num_input_pipelines,
                                              context.input_pipeline_id)
            self.expected = positions
            paths, tag_strings = epoch.records(positions)
            per_replica = dataclasses.replace(
                options, batch_size=context.get_per_replica_batch_size(options.batch_size))
            return training_dataset(paths, tag_strings, epoch.tags, per_replica, random_seed=epoch.random_seed,
                                    start_position=start, positions=positions, shards=epoch.shards)

        self.dataset = strategy.distribute_datasets_from_function(dataset)

    def observe(self, local_positions) -> None:
        for positions in local_positions:
            self.gaps.observe(positions)

    def finish(self) -> int:
        """Bad records of the whole slice, over all workers (the same number on every worker)."""
        flags = np.zeros(self.count)
        flags[self.gaps.missing(self.expected) - self.start] = 1.0
        missing = np.flatnonzero(self.sums(flags)) + self.start
        if len(missing) and self.role.is_chief:
            tracker = self.epoch.tracker(self.options.max_image_pixels)
            tracker.observe(np.setdiff1d(np.arange(self.start, self.start + self.count), missing))
            tracker.finish(self.start, self.count)
            self.bad_entries = tracker.last_bad
        return len(missing)


def shard_reader(index):
    """A reader of the project's packed shards (project.shards.ShardIndex), or None to read the files."""
    if index is None:
        return None
    from deepdanbooru.pipeline.packed import ShardReader

    return ShardReader(index)


def slice_input(strategy, role: ClusterRole, sums, epoch: Epoch, options: TrainingInput, start: int, stop: int):
    """Epoch positions start..stop-1 for this process: `.dataset` to iterate, `.observe`, `.finish`."""
    if role.in_cluster:
        if options.data_service:
            raise ConfigError(file_field("project.json", "data_service", (
                "is for one training process (one host, any number of its GPUs); with TF_CONFIG every host "
                "decodes its own part: set data_service to null")))
        return ShardedSlice(strategy, role, sums, epoch, options, start, stop)
    return WholeSlice(strategy, epoch, options, start, stop)
