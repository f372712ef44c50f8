"""Optimizer registry: a name from project.json -> a fresh keras optimizer."""

from __future__ import annotations

import keras

from deepdanbooru.errors import ModelError

OPTIMIZERS = {
    "adam": lambda rate, **clip: keras.optimizers.Adam(learning_rate=rate, **clip),
    # DeepDanbooru's "sgd" always meant Nesterov momentum 0.9.
    "sgd": lambda rate, **clip: keras.optimizers.SGD(learning_rate=rate, momentum=0.9, nesterov=True, **clip),
    "rmsprop": lambda rate, **clip: keras.optimizers.RMSprop(learning_rate=rate, **clip),
}


def make_optimizer(name: str, learning_rate: float, clipnorm: float | None = None,
                   global_clipnorm: float | None = None) -> keras.optimizers.Optimizer:
    """`clipnorm` clips each variable's gradient on its own; `global_clipnorm` (project key
    gradient_clip_norm) scales all gradients together so their joint norm is at most the value,
    keeping the update's direction. None disables; give at most one."""
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ModelError(
            f"optimizer: unsupported optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}"
        ) from None
    return factory(learning_rate, clipnorm=clipnorm, global_clipnorm=global_clipnorm)
