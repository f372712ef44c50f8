"""The one builder: a registry row in (deepdanbooru.registry), a functional keras.Model out."""

from __future__ import annotations

import keras
from keras import layers

from deepdanbooru.errors import ModelError
from deepdanbooru.models.table import check_model_input
from deepdanbooru.registry import FAMILIES, HEADS, resolve


def build_model(name: str, input_shape, n_tags: int, seed: int = 0) -> keras.Model:
    """Build `name` for input (height, width, channels) with `n_tags` sigmoid outputs.

    Initial weights are a pure function of `seed`. Under a mixed_float16
    global policy the trunk computes in float16, but the output layer is
    float32 so losses and thresholds see full-precision probabilities.
    """
    input_shape = tuple(input_shape)
    architecture = check_model_input(name, input_shape)
    if isinstance(n_tags, bool) or not isinstance(n_tags, int) or n_tags <= 0:
        raise ModelError(f"n_tags: must be a positive integer, got {n_tags!r}")

    family = FAMILIES[architecture.family]
    inputs = keras.Input(shape=input_shape, name="image")
    x = resolve(family.trunk)(name, inputs, seed)
    x = resolve(HEADS[architecture.head].builder)(x, n_tags, seed)
    outputs = layers.Activation("sigmoid", dtype="float32", name="output")(x)
    model = keras.Model(inputs, outputs, name=name)
    if family.finish:
        resolve(family.finish)(model, seed)
    return model


def parameter_count(variables) -> int:
    """The number of values in `variables`."""
    count = 0
    for variable in variables:
        size = 1
        for dim in variable.shape:
            size *= int(dim)
        count += size
    return count


def count_weights(model: keras.Model) -> tuple[int, int]:
    """(trainable, non_trainable) parameter counts of a built model."""
    return parameter_count(model.trainable_weights), parameter_count(model.non_trainable_weights)


def describe_model(name: str, input_shape, n_tags: int) -> dict:
    """Build the model and report what a user needs to size it."""
    model = build_model(name, input_shape, n_tags)
    trainable, non_trainable = count_weights(model)
    return {
        "model": name,
        "input_shape": [int(d) for d in model.input_shape[1:]],
        "output_shape": [int(d) for d in model.output_shape[1:]],
        "trainable": trainable,
        "non_trainable": non_trainable,
        "layers": len(model.layers),
    }
