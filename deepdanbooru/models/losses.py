"""Loss registry: a name from project.json -> a keras Loss.

Every loss averages over the tag axis per sample (optionally weighting each
tag), so reduction "sum_over_batch_size" is the mean over all elements, and
reduction "none" gives per-sample values for `tf.nn.compute_average_loss`
under a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import ops

from deepdanbooru.errors import ModelError

FOCAL_ALPHA = 0.25
FOCAL_GAMMA = 2.0
FOCAL_EPSILON = 1e-7
# The log guard of Ridnik et al.'s reference implementation.
ASL_EPSILON = 1e-8


def focal_loss(y_true, y_pred):
    """Binary focal loss (alpha 0.25, gamma 2), mean over the tag axis."""
    return ops.mean(_focal_elementwise(y_true, y_pred), axis=-1)


def _focal_elementwise(y_true, y_pred):
    y_pred = ops.clip(y_pred, FOCAL_EPSILON, 1.0 - FOCAL_EPSILON)
    y_true = ops.cast(y_true, y_pred.dtype)
    alpha_t = y_true * FOCAL_ALPHA + (1.0 - y_true) * (1.0 - FOCAL_ALPHA)
    p_t = y_true * y_pred + (1.0 - y_true) * (1.0 - y_pred)
    return -alpha_t * ops.power(1.0 - p_t, FOCAL_GAMMA) * ops.log(p_t)


@dataclass(frozen=True)
class Asymmetric:
    """ASL (Ridnik et al., "Asymmetric Loss For Multi-Label Classification", 2021), per element.

    A negative's probability is shifted down by `clip` (p_m = max(p - clip, 0)), so easy negatives
    contribute nothing at all; positives and negatives are then focused separately:
        -y (1 - p)^gamma_pos log(p) - (1 - y) p_m^gamma_neg log(1 - p_m)
    Defaults are the paper's multi-label setting. Bases are floored at epsilon before the power so
    the gradient stays finite where a base is exactly 0 (a saturated sigmoid, a shifted-away negative).
    """

    gamma_neg: float = 4.0
    gamma_pos: float = 0.0
    clip: float = 0.05

    def __call__(self, y_true, y_pred):
        y_true = ops.cast(y_true, y_pred.dtype)
        shifted = ops.maximum(y_pred - self.clip, 0.0)
        positive = ops.power(ops.maximum(1.0 - y_pred, ASL_EPSILON), self.gamma_pos) \
            * ops.log(ops.maximum(y_pred, ASL_EPSILON))
        negative = ops.power(ops.maximum(shifted, ASL_EPSILON), self.gamma_neg) \
            * ops.log(ops.maximum(1.0 - shifted, ASL_EPSILON))
        return -(y_true * positive + (1.0 - y_true) * negative)


def _binary_crossentropy(y_true, y_pred):
    return ops.binary_crossentropy(ops.cast(y_true, y_pred.dtype), y_pred)


# Registered so a model compiled with it still deserializes inside this
# package; exports are saved uncompiled, so plain Keras never needs it.
@keras.saving.register_keras_serializable(package="deepdanbooru")
class FocalLoss(keras.losses.Loss):
    def __init__(self, reduction="sum_over_batch_size", name="focal_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        return focal_loss(y_true, y_pred)


class TagLoss(keras.losses.Loss):
    """An element-wise loss, each tag weighted (weights None: all 1), averaged over the tag axis."""

    def __init__(self, elementwise, tag_weights=None, reduction="sum_over_batch_size", name="tag_loss"):
        super().__init__(reduction=reduction, name=name)
        self.elementwise = elementwise
        self.tag_weights = None if tag_weights is None else ops.convert_to_tensor(tag_weights, "float32")

    def call(self, y_true, y_pred):
        loss = self.elementwise(y_true, y_pred)
        if self.tag_weights is not None:
            loss = loss * ops.cast(self.tag_weights, loss.dtype)
        return ops.mean(loss, axis=-1)


# name -> (the unweighted loss DeepDanbooru projects train with, or None; element-wise form from options).
LOSSES = {
    "binary_crossentropy": (
        lambda reduction: keras.losses.BinaryCrossentropy(reduction=reduction, name="binary_crossentropy"),
        lambda options: _binary_crossentropy),
    "focal_loss": (lambda reduction: FocalLoss(reduction=reduction), lambda options: _focal_elementwise),
    "asymmetric": (None, lambda options: Asymmetric(**options)),
}


def make_loss(name: str, reduction: str = "sum_over_batch_size", options: dict | None = None,
              tag_weights=None) -> keras.losses.Loss:
    """`options`: the loss's parameters (asymmetric: gamma_neg, gamma_pos, clip); `tag_weights`: one per tag."""
    try:
        plain, elementwise = LOSSES[name]
    except KeyError:
        raise ModelError(f"loss: unsupported loss {name!r}; valid: {', '.join(LOSSES)}") from None
    if plain is not None and tag_weights is None:
        return plain(reduction)  # the exact computation of today's projects
    return TagLoss(elementwise(options or {}), tag_weights, reduction=reduction, name=name)


def as_loss(loss, reduction: str) -> keras.losses.Loss:
    """A loss name (unweighted, default parameters) or an already made Loss."""
    return make_loss(loss, reduction) if isinstance(loss, str) else loss


def project_loss(config, reduction: str = "sum_over_batch_size", tag_weights=None) -> keras.losses.Loss:
    """The loss a ProjectConfig asks for, with its parameters."""
    options = {}
    if config.loss == "asymmetric":
        options = {"gamma_neg": config.asl_gamma_neg, "gamma_pos": config.asl_gamma_pos, "clip": config.asl_clip}
    return make_loss(config.loss, reduction, options, tag_weights)
