"""The trunk of a tagger: loading its weights from a file (backbone_weights) and freezing it.

Every layer of a model is trunk except the head (models.head: the per-tag layer
and the weightless layers after it, found by structure).

A weights file is read by the model it was written for, then copied layer by
layer, in order, into our trunk:
- .weights.h5 or .h5: for convnext_* and efficientnetv2_*, the keras.applications
  model with include_top=False (any input size and include_preprocessing;
  e.g. its ImageNet `_notop.h5`); for resnet_* and vit_*, `build_trunk(name,
  input_shape)` of this module;
- .keras: a whole model of the same architecture, e.g. one of our exports
  trained on other tags (its head is ignored);
- a timm checkpoint folder (config.json + model.safetensors) of a ViT or
  ConvNeXt of the same size (models.timm.trunk).
Keras reads the file, so a file of another architecture fails there; the
layer-by-layer copy then names the first layer whose weights differ in shape.
"""

from __future__ import annotations

import warnings
from itertools import zip_longest
from pathlib import Path

import keras
import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.head import head_layers, trunk_layers
from deepdanbooru.models.table import get_architecture


def build_trunk(name: str, input_shape, seed: int = 0) -> keras.Model:
    """build_model without its head: the model a resnet_* or vit_* backbone_weights file is written from."""
    from deepdanbooru.models.builder import build_model

    model = build_model(name, input_shape, 1, seed=seed)
    head = {id(layer) for layer in head_layers(model)}
    last = [layer for layer in model.layers if id(layer) not in head][-1]
    return keras.Model(model.input, last.output, name=f"{name}_trunk")


def _reference(name: str, path: Path, input_shape) -> keras.Model:
    if path.suffix.lower() == ".keras":
        from deepdanbooru.models.files import load_model_file

        return load_model_file(path)
    if get_architecture(name).application:
        from deepdanbooru.models.applications import reference_trunk

        reference = reference_trunk(name, input_shape)
    else:
        reference = build_trunk(name, input_shape)
    # Keras skips, with a warning, parts of a .weights.h5 it finds no group for: what is still NaN
    # afterwards was not in the file.
    for weight in reference.weights:
        weight.assign(np.full(tuple(weight.shape), np.nan, dtype=weight.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference.load_weights(path)
    for layer in _trunk_layers(reference):
        if any(np.isnan(keras.ops.convert_to_numpy(weight)).any() for weight in layer.weights):
            raise ModelError(file_field(path, None, f"does not fit {name}'s trunk: no weights for layer "
                                        f"{layer.name!r} ({_shapes(layer)})"))
    return reference


def _flat_layers(model):
    # keras.applications nest Sequential blocks (ConvNeXt's stem and downsampling); ours are inlined.
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _flat_layers(layer)
        else:
            yield layer


def _trunk_layers(model):
    head = {id(layer) for layer in head_layers(model)}
    return [layer for layer in _flat_layers(model) if layer.weights and id(layer) not in head]


def _squeezed(layer) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in weight.shape if d != 1) for weight in layer.weights]


def _shapes(layer) -> str:
    return ", ".join(str(tuple(weight.shape)) for weight in layer.weights) if layer else "nothing"


def load_backbone_weights(model: keras.Model, name: str, path, input_shape) -> int:
    """Copy the trunk weights in `path` into `model`'s trunk; returns the number of layers loaded."""
    path = Path(path)
    if path.is_dir():
        from deepdanbooru.models.timm.trunk import load_trunk

        return load_trunk(model, name, path)
    try:
        reference = _reference(name, path, input_shape)
    except ModelError:
        raise
    except Exception as error:  # Keras raises anything from OSError to ValueError for a file it cannot read
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise ModelError(file_field(path, None, f"cannot be read as {name} trunk weights: {reason}")) from None
    pairs = list(zip_longest(_trunk_layers(reference), _trunk_layers(model)))
    for source, target in pairs:
        if source is None or target is None or _squeezed(source) != _squeezed(target):
            where = f"layer {target.name!r}" if target else "after the trunk's last layer"
            found = f"{source.name!r} ({_shapes(source)})" if source else "no more layers"
            raise ModelError(file_field(path, None, f"does not fit {name}'s trunk: first difference at {where} "
                                        f"({_shapes(target)}), the file has {found}"))
    for source, target in pairs:
        # Equal but for axes of 1: ConvNeXt's LayerScale (C,) is a (1, 1, C, 1) depthwise kernel here.
        target.set_weights([np.reshape(keras.ops.convert_to_numpy(w), tuple(t.shape))
                            for w, t in zip(source.weights, target.weights)])
    return len(pairs)


def freezable_layers(model: keras.Model) -> list:
    """The trunk layers that train, taken before any freeze: a layer its builder made non-trainable (the
    constants import-model stores as weights, such as SwinV2's shift masks) stays so when the trunk unfreezes."""
    return [layer for layer in trunk_layers(model) if layer.trainable]


def set_backbone_trainable(layers, trainable: bool) -> bool:
    """Freeze or unfreeze `layers` (`freezable_layers`); returns whether anything changed.

    Frozen layers follow Keras' rule: no gradients, and batch normalization
    runs on its moving statistics.
    """
    changed = False
    for layer in layers:
        if layer.trainable != trainable:
            layer.trainable = trainable
            changed = True
    return changed
