"""A model's scores and loss over labelled batches, into the streaming metrics.

The trainer's validation and `evaluate-project --metrics` both measure through
`measure`, so a figure printed during training and one measured later on an
export are the same computation: inference preprocessing (no augmentation),
the project's loss per image, ValidationMetrics at the working threshold.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from deepdanbooru.compiling import XlaFunction
from deepdanbooru.models.losses import as_loss
from deepdanbooru.scoring.metrics import ValidationMetrics


class BatchScorer:
    """(images, labels) -> (float32 scores, summed per-image loss); one trace serves every batch size."""

    def __init__(self, model, loss, height: int, width: int, jit_compile: bool = False, echo=print):
        """loss: a loss name, or a Loss made with reduction "none" (models.losses.project_loss).
        jit_compile: under XLA where it compiles (compiling.XlaFunction)."""
        self.model = model
        self.n_tags = int(model.output_shape[-1])
        self._loss = as_loss(loss, "none")
        self._call = XlaFunction(self._score, [
            tf.TensorSpec([None, height, width, 3], tf.float32),
            tf.TensorSpec([None, self.n_tags], tf.float32),
        ], jit_compile, "the validation forward pass", echo)

    def _score(self, images, labels):
        # The output layer is float32 under mixed precision too; the cast only guards foreign models.
        scores = tf.cast(self.model(images, training=False), tf.float32)
        return scores, tf.reduce_sum(tf.cast(self._loss(labels, scores), tf.float64))

    def __call__(self, images, labels) -> tuple[np.ndarray, float]:
        scores, loss_sum = self._call(images, labels)
        return scores.numpy(), float(loss_sum.numpy())


def measure(scorer: BatchScorer, dataset, threshold: float, observe=None, categories=None) -> ValidationMetrics:
    """Feed every labelled batch of `dataset` to a fresh ValidationMetrics; observe(positions) per batch.

    categories: {"general": [tag indices], ...} (project.categories.category_indices) for per-category figures.
    """
    metrics = ValidationMetrics(scorer.n_tags, threshold=threshold, categories=categories)
    for batch in dataset:
        labels = batch["label"]
        scores, loss_sum = scorer(batch["image"], labels)
        metrics.update(scores, labels.numpy(), loss_sum)
        if observe is not None:
            observe(batch["position"].numpy())
    return metrics
