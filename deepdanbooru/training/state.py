"""The resume state inside every checkpoint: runstate's Counters and RunIdentity as tf.Variables.

Keeping them in the checkpoint means they can never disagree with the weights
saved beside them; runstate.state mirrors them to state.json for TF-free tools.
"""

from __future__ import annotations

from dataclasses import fields

import tensorflow as tf

from deepdanbooru.runstate.state import Counters, RunIdentity


class ResumeState(tf.Module):
    """The tf.Variables a checkpoint carries next to model and optimizer.

    Create it outside any strategy scope: these are host-side values the
    Python loop assigns right before each save, never touched by a step.
    """

    def __init__(self):
        super().__init__(name="resume_state")
        for field in fields(Counters):
            setattr(self, field.name, tf.Variable(0, dtype=tf.int64, trainable=False, name=field.name))
        self.model = tf.Variable("", dtype=tf.string, trainable=False, name="model")
        self.image_height = tf.Variable(0, dtype=tf.int64, trainable=False, name="image_height")
        self.image_width = tf.Variable(0, dtype=tf.int64, trainable=False, name="image_width")
        self.tags_hash = tf.Variable("", dtype=tf.string, trainable=False, name="tags_hash")
        self.tag_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="tag_count")
        # -1: null. A checkpoint written before the key existed keeps the initial value: every layer trained.
        self.trainable_blocks = tf.Variable(-1, dtype=tf.int64, trainable=False, name="trainable_blocks")
        # A short hash of the training ids: a changed database is noticed on resume, not refused.
        self.records_hash = tf.Variable("", dtype=tf.string, trainable=False, name="records_hash")

    def assign(self, counters: Counters, identity: RunIdentity, records_hash: str = "") -> None:
        for field in fields(Counters):
            getattr(self, field.name).assign(getattr(counters, field.name))
        self.model.assign(identity.model)
        self.image_height.assign(identity.image_height)
        self.image_width.assign(identity.image_width)
        self.tags_hash.assign(identity.tags_hash)
        self.tag_count.assign(identity.tag_count)
        self.trainable_blocks.assign(-1 if identity.trainable_blocks is None else identity.trainable_blocks)
        self.records_hash.assign(records_hash)

    def counters(self) -> Counters:
        return Counters(**{field.name: int(getattr(self, field.name).numpy()) for field in fields(Counters)})

    def identity(self) -> RunIdentity:
        return RunIdentity(
            model=self.model.numpy().decode("utf-8"),
            image_height=int(self.image_height.numpy()),
            image_width=int(self.image_width.numpy()),
            tags_hash=self.tags_hash.numpy().decode("utf-8"),
            tag_count=int(self.tag_count.numpy()),
            trainable_blocks=None if int(self.trainable_blocks.numpy()) < 0 else int(self.trainable_blocks.numpy()),
        )


def read_checkpoint_state(checkpoint_path: str) -> tuple[Counters, RunIdentity]:
    """Counters and identity of a checkpoint, without building its model."""
    state = ResumeState()
    tf.train.Checkpoint(state=state).read(checkpoint_path).expect_partial()
    return state.counters(), state.identity()
