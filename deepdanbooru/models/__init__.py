"""Models: what the registry's rows (ResNets, ConvNeXt, EfficientNetV2, ViT) need, their one builder, losses, optimizers, files.

    build_model(name, input_shape, n_tags, seed=0) -> keras.Model
    check_model_input(name, input_shape, source=None)      ModelError before building
    parameter_counts(name, input_shape, n_tags) -> (trainable, non_trainable), no TensorFlow
    model_names() -> tuple[str, ...]
    make_loss(name, reduction="sum_over_batch_size", options=None, tag_weights=None) -> keras.losses.Loss
    make_optimizer(name, learning_rate, clipnorm=None, global_clipnorm=None, weight_decay=None,
                   decay_exempt_variables=(), rate_factors=()) -> keras.optimizers.Optimizer
    optimizers.decay_exempt(model, name), optimizers.layer_rate_factors(model, name, layer_decay, source, network)
    load_model_file(path) -> keras.Model                   .keras, DeepDanbooru 1.0 .h5
    backbone.load_backbone_weights(model, name, path, input_shape)   backbone_weights
    backbone.build_trunk(name, input_shape) -> keras.Model  the model a trunk weights file is written from
    count_weights(model) -> (trainable, non_trainable)
    timm.checkpoint.import_checkpoint(folder, channel_order=None)   a timm checkpoint folder as a Keras model

The models themselves are registered in deepdanbooru.registry. `table` and
`counts` are standard library only; everything else imports Keras, so the
names are resolved on first use and `import deepdanbooru.models.table` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "check_model_input": "table",
    "model_names": "table",
    "parameter_counts": "table",
    "minimum_input_size": "table",
    "build_model": "builder",
    "count_weights": "builder",
    "describe_model": "builder",
    "make_loss": "losses",
    "focal_loss": "losses",
    "make_optimizer": "optimizers",
    "load_model_file": "files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
