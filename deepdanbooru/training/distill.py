"""source_distillation: a fine-tune also learns the source's own scores on the tags the source knows
(learning without forgetting, Li and Hoiem 2016).

Every training step runs the start, the weights the run began from (the --source-model with its head
mapped onto tags.txt, kept by training.wise.StartWeights), on the same augmented batch in inference mode,
and adds to each picture's loss

    weight * mean over tags.txt of  known(tag) * BCE(start's score, model's score)

known(tag) being 1 for a tag the source knows and 0 for a new one, so a new tag learns from its labels
alone and a known tag is pulled toward what the source said as well as toward its label. The mean runs
over every tag, as the project's loss does, so a weight of 1 gives a known tag's distillation the
weight of its label. The start never trains (no gradient reaches it); the known tags are kept in the
checkpoint, so a resumed run (which does not read the source again) distils the same ones.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from deepdanbooru.training.start import known_tags_state

CHECKPOINT_KEY = "source_distillation"
EPSILON = 1e-7


class Distillation:
    """Create inside the strategy scope after the model, before the checkpoint is restored; call `load` after."""

    def __init__(self, model, weight: float, known, start):
        """`known`: tags.txt positions of the tags the source knows (a fresh run's; a resume's come from its
        checkpoint); `start`: training.wise.StartWeights of `model`."""
        self.weight = float(weight)
        self.start = start
        self.teacher = keras.models.clone_model(model)
        self.known, self.state = known_tags_state(model, known, CHECKPOINT_KEY)
        self._model = model

    def load(self) -> None:
        """The teacher's weights: the start where the run trains a weight, the model's own where it never does."""
        starts = {id(weight): start for weight, start in zip(self.start.weights, self.start.starts)}
        for mine, theirs in zip(self.teacher.weights, self._model.weights):
            mine.assign(starts.get(id(theirs), theirs))

    def targets(self, images):
        """The start's scores on the batch (outside the gradient tape: nothing of it trains)."""
        return tf.stop_gradient(tf.cast(self.teacher(images, training=False), tf.float32))

    def per_example(self, teacher, scores):
        """The distillation term of each picture of the batch, from `targets` and the model's scores: (batch,)."""
        student = tf.clip_by_value(tf.cast(scores, tf.float32), EPSILON, 1.0 - EPSILON)
        cross = -(teacher * tf.math.log(student) + (1.0 - teacher) * tf.math.log(1.0 - student))
        return self.weight * tf.reduce_mean(cross * self.known, axis=-1)
