"""Loss registry: a name from project.json -> a keras Loss.

Both losses average over the tag axis per sample, so reduction
"sum_over_batch_size" is the mean over all elements, and reduction "none"
gives per-sample values for `tf.nn.compute_average_loss` under a strategy.
"""

from __future__ import annotations

import keras
from keras import ops

from deepdanbooru.errors import ModelError

FOCAL_ALPHA = 0.25
FOCAL_GAMMA = 2.0
FOCAL_EPSILON = 1e-7


def focal_loss(y_true, y_pred):
    """Binary focal loss (alpha 0.25, gamma 2), mean over the tag axis."""
    y_pred = ops.clip(y_pred, FOCAL_EPSILON, 1.0 - FOCAL_EPSILON)
    y_true = ops.cast(y_true, y_pred.dtype)
    alpha_t = y_true * FOCAL_ALPHA + (1.0 - y_true) * (1.0 - FOCAL_ALPHA)
    p_t = y_true * y_pred + (1.0 - y_true) * (1.0 - y_pred)
    loss = -alpha_t * ops.power(1.0 - p_t, FOCAL_GAMMA) * ops.log(p_t)
    return ops.mean(loss, axis=-1)


# Registered so a model compiled with it still deserializes inside this
# package; exports are saved uncompiled, so plain Keras never needs it.
@keras.saving.register_keras_serializable(package="deepdanbooru")
class FocalLoss(keras.losses.Loss):
    def __init__(self, reduction="sum_over_batch_size", name="focal_loss", dtype=None):
        super().__init__(reduction=reduction, name=name, dtype=dtype)

    def call(self, y_true, y_pred):
        return focal_loss(y_true, y_pred)


LOSSES = {
    "binary_crossentropy": lambda reduction: keras.losses.BinaryCrossentropy(
        reduction=reduction, name="binary_crossentropy"
    ),
    "focal_loss": lambda reduction: FocalLoss(reduction=reduction),
}


def make_loss(name: str, reduction: str = "sum_over_batch_size") -> keras.losses.Loss:
    try:
        factory = LOSSES[name]
    except KeyError:
        raise ModelError(f"loss: unsupported loss {name!r}; valid: {', '.join(LOSSES)}") from None
    return factory(reduction)
