"""Each slice's input for the strategy in use, and the agreements a cluster needs.

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
import hashlib

import numpy as np
import tensorflow as tf

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.pipeline import BadImageTracker, training_dataset
from deepdanbooru.training import data
from deepdanbooru.training.cluster import ClusterRole

_SUM = tf.distribute.ReduceOp.SUM


def shard_offsets(count: int, batch_size: int, workers: int, worker: int) -> np.ndarray:
    """Offsets in a slice of `count` records that `worker` reads: its part of every global batch."""
    share = batch_size // workers
    offsets = np.arange(count, dtype=np.int64)
    return offsets[(offsets % batch_size) // share == worker]


class WorkerSums:
    """Element-wise sums of float64 vectors over the workers (a collective: every worker must call it together)."""

    def __init__(self, strategy):
        self.strategy = strategy
        # Every local replica contributes the vector; the total is divided by the local replica count.
        self.local_replicas = len(strategy.extended.worker_devices)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)], autograph=False)
        def total(vector):
            per_replica = strategy.run(tf.identity, args=(vector,))
            return strategy.reduce(_SUM, per_replica, axis=None)

        self._total = total

    def __call__(self, vector) -> np.ndarray:
        summed = self._total(tf.constant(np.asarray(vector, dtype=np.float64)))
        return np.rint(summed.numpy() / self.local_replicas)


class ShardedSlice:
    """SliceData's interface (observe, finish) for one worker's shard of a slice."""

    def __init__(self, strategy, role: ClusterRole, sums: WorkerSums, config, tags, paths, tag_strings,
                 order: np.ndarray, *, start: int, stop: int, random_seed: int, epoch: int, bad_image_log):
        self.role = role
        self.sums = sums
        self.start, self.count = start, stop - start
        self.epoch_paths = data.EpochPaths(paths, order)
        self.bad_image_log = bad_image_log
        self.max_image_pixels = config.max_image_pixels
        self.context = f"epoch {epoch}"
        self.expected = np.zeros(0, np.int64)
        self._observed: list[np.ndarray] = []

        def dataset(context: tf.distribute.InputContext):
            positions = start + shard_offsets(self.count, config.minibatch_size, context.num_input_pipelines,
                                              context.input_pipeline_id)
            self.expected = positions
            records = order[positions]
            return training_dataset(
                [paths[i] for i in records], [tag_strings[i] for i in records], tags,
                height=config.image_height, width=config.image_width, rotation_range=config.rotation_range,
                scale_range=config.scale_range, shift_range=config.shift_range,
                horizontal_flip=config.horizontal_flip, crop_area_range=config.crop_area_range, mixup=config.mixup,
                seed=config.seed,
                random_seed=random_seed, start_position=start, positions=positions,
                batch_size=context.get_per_replica_batch_size(config.minibatch_size),
                max_image_pixels=config.max_image_pixels)

        self.distributed = strategy.distribute_datasets_from_function(dataset)

    def observe(self, local_positions) -> None:
        self._observed.extend(np.asarray(p, dtype=np.int64).reshape(-1) for p in local_positions)

    def finish(self) -> int:
        """Bad records of the whole slice, over all workers (the same number on every worker)."""
        observed = np.concatenate(self._observed) if self._observed else np.zeros(0, np.int64)
        self._observed = []
        gaps = np.zeros(self.count)
        gaps[np.setdiff1d(self.expected, observed) - self.start] = 1.0
        missing = np.flatnonzero(self.sums(gaps)) + self.start
        if len(missing) and self.role.is_chief:
            tracker = BadImageTracker(self.bad_image_log, self.epoch_paths, max_image_pixels=self.max_image_pixels,
                                      context=self.context)
            tracker.observe(np.setdiff1d(np.arange(self.start, self.start + self.count), missing))
            tracker.finish(self.start, self.count)
        return len(missing)


def distribute_slice(strategy, role: ClusterRole, sums: WorkerSums | None, config, tags, paths, tag_strings,
                     order: np.ndarray, *, start: int, stop: int, random_seed: int, epoch: int, bad_image_log):
    """(slice data with observe/finish, distributed dataset) of order[start:stop] for this process."""
    if role.in_cluster:
        sliced = ShardedSlice(strategy, role, sums, config, tags, paths, tag_strings, order, start=start, stop=stop,
                              random_seed=random_seed, epoch=epoch, bad_image_log=bad_image_log)
        return sliced, sliced.distributed
    sliced = data.slice_dataset(config, tags, paths, tag_strings, order, start=start, stop=stop,
                                random_seed=random_seed, epoch=epoch, bad_image_log=bad_image_log)
    return sliced, strategy.experimental_distribute_dataset(sliced.dataset)


# --- the setup every worker must share ---

def _fingerprint(value) -> float:
    # 48 bits: exact in float64, so the sums below compare exactly.
    return float(int(hashlib.sha256(repr(value).encode()).hexdigest()[:12], 16))


def setup_fingerprints(config, identity, records_hash: str, counters, checkpoint: str | None) -> dict[str, float]:
    settings = {key: value for key, value in dataclasses.asdict(config).items() 
                if key not in ("database_path", "project_dir")}  # hosts may mount them differently
    return {
        "the training records (database rows, minimum_tag_count, image_extensions)": _fingerprint(records_hash),
        "project.json settings": _fingerprint(sorted(settings.items())),
        "model, input size and tags.txt": _fingerprint(identity),
        "the checkpoint to resume from (checkpoints/)":
            _fingerprint((checkpoint and checkpoint.rsplit("/", 1)[-1], counters)),
    }


def check_same_setup(sums: WorkerSums, role: ClusterRole, fingerprints: dict[str, float]) -> None:
    """Refuse to train when workers read different projects: the sums would silently mix them."""
    table = np.zeros((role.workers, len(fingerprints)))
    table[role.worker_number] = list(fingerprints.values())
    table = sums(table.reshape(-1)).reshape(role.workers, len(fingerprints))
    chief = table[0]
    differing = [(worker, [name for name, a, b in zip(fingerprints, chief, row) if a != b])
                 for worker, row in enumerate(table)]
    differing = [(worker, names) for worker, names in differing if names]
    if differing:
        # role.tasks lists the chief first, then the workers: TensorFlow's task numbering.
        details = "; ".join(f"{role.tasks[worker][0]}:{role.tasks[worker][1]} ({role.tasks[worker][2]}): "
                            f"{', '.join(names)}" for worker, names in differing)
        raise TrainingError(file_field(
            "TF_CONFIG", None,
            f"{role.describe()}: the workers do not train the same setup as the chief ({details}). Every task "
            "must see the same project directory, database and images, e.g. on a shared file system"))
