"""The tagger head: find it in any of our or DeepDanbooru's models, set its bias, grow its vocabulary.

The one definition of "head", used by freezing, trunk weights, growth, the prior bias and exports:
the layer with weights nearest the output, whose kernel has one unit per tag (our dense or 1x1-conv
head; DeepDanbooru's `Conv2D(n_tags, 1x1) -> GlobalAveragePooling2D -> sigmoid` too), plus the
weightless layers between it and the output. Found by structure, never by layer name, so models
whose layers Keras numbered (DeepDanbooru 1.0's) are read the same way as ours. Every other layer
with weights is trunk.
"""

from __future__ import annotations

import keras
import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.precision import output_layer_names


def _producer(model: keras.Model, tensor):
    """The layer of `model` whose output is `tensor` (public names only: Layer.output), or None."""
    for layer in model.layers:
        try:
            output = layer.output
        except (AttributeError, ValueError):  # a layer called more than once has no single output
            continue
        if output is tensor:
            return layer
    return None


def _walk_to_head(model: keras.Model) -> list:
    """[head layer, weightless layers after it ..., output layer]; raises ModelError when there is none.

    Walks back from the output layer (models.precision.output_layer_names) through weightless layers
    (activation, pooling, flatten).
    """
    names = sorted(output_layer_names(model))
    if len(names) != 1:
        raise ModelError(f"{model.name}: expected one output layer, found {len(names)}")
    layer = model.get_layer(names[0])
    path = [layer]
    while not layer.weights:
        inbound = layer.input
        producer = None if isinstance(inbound, (list, tuple)) else _producer(model, inbound)
        if producer is None:
            raise ModelError(f"{model.name}: cannot find the output layer's weights")
        layer = producer
        path.append(layer)
    kernel = getattr(layer, "kernel", None)
    if len(model.output_shape) != 2 or kernel is None or int(kernel.shape[-1]) != int(model.output_shape[-1]):
        raise ModelError(f"{model.name}: the last layer with weights ({layer.name}) is not a head of one unit per tag")
    return path[::-1]


def head_layer(model: keras.Model):
    """The layer whose kernel has one unit per tag (see the module's definition of the head)."""
    return _walk_to_head(model)[0]


def head_layers(model: keras.Model) -> list:
    """Every layer of the head: the per-tag layer and the weightless layers up to the output.

    Empty for a model without a per-tag head (a trunk, e.g. a keras.applications model without its top).
    """
    try:
        return _walk_to_head(model)
    except ModelError:
        return []


def trunk_layers(model: keras.Model) -> list:
    """The top-level layers with weights that are not the head (a nested model counts as one layer)."""
    head = {id(layer) for layer in head_layers(model)}
    return [layer for layer in model.layers if layer.weights and id(layer) not in head]


def has_bias(layer) -> bool:
    return getattr(layer, "bias", None) is not None


def set_head_bias(model: keras.Model, values) -> None:
    layer = head_layer(model)
    layer.bias.assign(np.asarray(values, dtype=layer.bias.dtype))


def _resized(layer, n_tags: int):
    """The head layer rebuilt for n_tags units, always with a bias: the bias is where a new tag's prior goes."""
    config = layer.get_config()
    config["filters" if "filters" in config else "units"] = n_tags
    config["use_bias"] = True
    return layer.__class__.from_config(config)


def grow_vocabulary(model: keras.Model, source_tags, tags, new_bias, source=None) -> tuple[keras.Model, dict]:
    """A copy of `model` whose head has one unit per tag of `tags`.

    Every other layer keeps its weights; a tag in both vocabularies keeps its kernel column and bias
    exactly; a new tag gets a zero kernel column and the bias `new_bias[i]`, so it starts at exactly
    that output for every image (its prior, with the log-odds of its frequency) and learns its column
    from there; a tag missing from `tags` is dropped. A head without a bias (every ResNet and
    DeepDanbooru head) gains one, zero for the kept tags, so their outputs stay exactly as they were.
    Returns (model, {"kept", "new", "dropped"}).
    """
    head = head_layer(model)
    if int(model.output_shape[-1]) != len(source_tags):
        raise ModelError(file_field(source, "output", f"has {int(model.output_shape[-1])} units but its tags list "
                                                      f"{len(source_tags)}; give the tags file it was trained with"))
    try:
        grown = keras.models.clone_model(
            model, clone_function=lambda layer: _resized(layer, len(tags)) if layer is head
            else layer.__class__.from_config(layer.get_config()))
    except (TypeError, ValueError) as error:
        raise ModelError(file_field(source, None, f"cannot rebuild its head for {len(tags)} tags: {error}")) from None
    for layer in model.layers:
        if layer is not head and layer.weights:
            grown.get_layer(layer.name).set_weights(layer.get_weights())

    old_index = {tag: i for i, tag in enumerate(source_tags)}
    pairs = [(i, old_index[tag]) for i, tag in enumerate(tags) if tag in old_index]
    new_rows, old_rows = (np.array([p[k] for p in pairs], dtype=np.int64) for k in (0, 1))
    fresh = np.array([i for i, tag in enumerate(tags) if tag not in old_index], dtype=np.int64)
    target = grown.get_layer(head.name)
    kernel = np.zeros(tuple(target.kernel.shape), dtype=keras.backend.standardize_dtype(target.kernel.dtype))
    kernel[..., new_rows] = keras.ops.convert_to_numpy(head.kernel)[..., old_rows]
    target.kernel.assign(kernel)
    bias = np.zeros(tuple(target.bias.shape), dtype=keras.backend.standardize_dtype(target.bias.dtype))
    if has_bias(head):
        bias[new_rows] = keras.ops.convert_to_numpy(head.bias)[old_rows]
    bias[fresh] = np.asarray(new_bias, dtype=bias.dtype)[fresh]
    target.bias.assign(bias)
    summary = {"kept": len(pairs), "new": len(fresh), "dropped": len(source_tags) - len(pairs)}
    return grown, summary
