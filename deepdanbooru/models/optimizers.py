"""Optimizer registry: a name from project.json -> a fresh keras optimizer."""

from __future__ import annotations

import keras

from deepdanbooru.errors import ModelError

OPTIMIZERS = {
    "adam": lambda rate, clip: keras.optimizers.Adam(learning_rate=rate, clipnorm=clip),
    # DeepDanbooru's "sgd" always meant Nesterov momentum 0.9.
    "sgd": lambda rate, clip: keras.optimizers.SGD(
        learning_rate=rate, momentum=0.9, nesterov=True, clipnorm=clip
    ),
    "rmsprop": lambda rate, clip: keras.optimizers.RMSprop(learning_rate=rate, clipnorm=clip),
}


def make_optimizer(name: str, learning_rate: float, clipnorm: float | None = None) -> keras.optimizers.Optimizer:
    """`clipnorm` clips each gradient's norm (project key gradient_clip_norm); None disables."""
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ModelError(
            f"optimizer: unsupported optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}"
        ) from None
    return factory(learning_rate, clipnorm)
