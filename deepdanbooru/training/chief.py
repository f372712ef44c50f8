"""Checkpoints in a cluster: the chief writes them into checkpoints/, the other workers do not.

Every variable the trainer checkpoints is mirrored ON_WRITE (each replica
holds the same value), and TensorFlow saves such variables from one task
alone without any collective, so a worker has nothing to write. Only if a
variable synchronized ON_READ were added (its value is a reduction over the
replicas, which every task must join) would TensorFlow's multi-worker saving
need each worker to write too; the worker then writes into a private
temporary directory outside the project and deletes it straight away.

Workers still count their checkpoints like the chief (`save_counter` comes
back from the restored checkpoint), so the names they print are the chief's.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import tensorflow as tf

from deepdanbooru.runstate.cluster import ClusterRole


def needs_every_worker(variables) -> bool:
    """True when saving involves a cross-replica reduction (an ON_READ distributed variable)."""
    for variable in variables:
        variable = getattr(variable, "value", variable)  # a Keras variable wraps the tf.Variable
        if isinstance(variable, tf.distribute.DistributedValues) and \
                variable.synchronization == tf.VariableSynchronization.ON_READ:
            return True
    return False


class WorkerCheckpoints:
    """The CheckpointManager calls the loop makes (`save`, `latest_checkpoint`), for a worker that is not the chief."""

    def __init__(self, checkpoint: tf.train.Checkpoint, directory, latest: str | None, write_private: bool,
                 checkpoint_name: str = "ckpt"):
        self.checkpoint = checkpoint
        self.prefix = os.path.join(str(directory), checkpoint_name)
        self.latest_checkpoint = latest
        self.write_private = write_private

    def save(self) -> str:
        counter = self.checkpoint.save_counter
        counter.assign_add(1)
        if self.write_private:
            private = tempfile.mkdtemp(prefix=f"deepdanbooru-worker-{os.getpid()}-")
            try:
                self.checkpoint.write(os.path.join(private, "ckpt"))
            finally:
                shutil.rmtree(private, ignore_errors=True)
        self.latest_checkpoint = f"{self.prefix}-{int(counter.numpy())}"
        return self.latest_checkpoint


def checkpoint_manager(checkpoint: tf.train.Checkpoint, directory, role: ClusterRole, latest: str | None,
                       variables, max_to_keep: int, checkpoint_name: str = "ckpt"):
    if role.is_chief:
        return tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=max_to_keep,
                                          checkpoint_name=checkpoint_name)
    return WorkerCheckpoints(checkpoint, directory, latest, needs_every_worker(variables), checkpoint_name)
