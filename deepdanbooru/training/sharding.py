"""What the workers of a cluster must agree on: sums over the workers, and the same setup everywhere.

How each worker reads its part of a slice is in training/data.py.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import tensorflow as tf

from deepdanbooru.compat import wait_for_every_task
from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.runstate.cluster import ClusterRole

_SUM = tf.distribute.ReduceOp.SUM


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


# The chief may still validate, checkpoint and export its last epoch while the workers wait at the end; a peer
# that died fails the wait at once through the coordination service's heartbeats, not at this limit.
LEAVING_TIMEOUT_SECONDS = 6 * 3600.0


def every_worker_agrees(worker_sums: WorkerSums | None, yes: bool) -> bool:
    """A vote every worker takes together (a collective): True only when each says yes; alone, its own answer."""
    if worker_sums is None:
        return yes
    return worker_sums([0.0 if yes else 1.0])[0] == 0


def leave_together(worker_sums: WorkerSums | None) -> None:
    """In a cluster (worker_sums given), after the last collective: a worker that left at once could close its
    socket while the chief still pulls its last share of that collective from it, failing the chief."""
    if worker_sums is not None:
        wait_for_every_task("deepdanbooru: training ended", LEAVING_TIMEOUT_SECONDS)


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


def agree_with_the_other_workers(strategy, role: ClusterRole, fingerprints: dict[str, float]) -> WorkerSums | None:
    """In a cluster: the sums every worker adds into, once every worker is seen to run the same setup."""
    if not role.in_cluster:
        return None
    sums = WorkerSums(strategy)
    check_same_setup(sums, role, fingerprints)
    return sums
