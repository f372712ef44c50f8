"""Mixed precision: which policy a run uses, and rebuilding a model under another policy."""

from __future__ import annotations

import os
from contextlib import contextmanager

import keras
import tensorflow as tf

MIXED = "mixed_float16"
FLOAT32 = "float32"
FORCE_ENV = "DEEPDANBOORU_FORCE_MIXED_PRECISION"


def forced_by_environment() -> bool:
    return os.environ.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def choose_policy(mixed_precision: bool, force: bool = False, echo=print) -> str:
    """mixed_float16 when asked and a GPU is visible (or forced); float32 otherwise, with a notice.

    TensorFlow has no fast float16 convolution kernels for CPUs (they run
    about 100x slower than float32), so a CPU-only machine trains in float32
    unless forced.
    """
    if not mixed_precision:
        return FLOAT32
    if force or forced_by_environment():
        return MIXED
    # Visible, not physical: `--devices cpu` hides the GPUs (training.strategy).
    if tf.config.get_visible_devices("GPU"):
        return MIXED
    echo("notice: mixed_precision is true but no GPU is visible; training in float32 (float16 on a CPU is "
         "about 100x slower). The .float32.keras copies are still written. To force float16 anyway, pass "
         f"--force-mixed-precision or set {FORCE_ENV}=1.")
    return FLOAT32


@contextmanager
def global_policy(policy: str):
    """Build layers under `policy` without leaking it to later code in the same process."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def output_layer_names(model: keras.Model) -> set[str]:
    # A functional model names its output layers; a Sequential model's output is its last layer.
    return set(getattr(model, "output_names", None) or [model.layers[-1].name])


def with_policy(model: keras.Model, policy: str) -> keras.Model:
    """An uncompiled copy of `model` computing under `policy`, with the same weights.

    The output layers stay float32 so probabilities, losses and thresholds
    never see float16 rounding.
    """
    outputs = output_layer_names(model)

    def clone(layer):
        config = layer.get_config()
        config["dtype"] = FLOAT32 if layer.name in outputs else policy
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights())
    return copy
