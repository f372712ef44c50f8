"""MaxPooling2D computed as a maximum over strided slices, so a compiled step keeps op determinism.

Training runs with TensorFlow's op determinism on (a killed and resumed run
ends with the same weights as one that never stopped). Under XLA
(`jit_compile`), the gradient of TensorFlow's MaxPool op has no deterministic
implementation and the compile stops ("MaxPool gradient ops do not yet have a
deterministic XLA implementation"), on the CPU as well.

The same forward value is a running `maximum` over the pool's k x k strided
slices of the input, padded with -inf where the layer pads: each output is
the maximum of the same window, exactly (a maximum rounds nothing). Its
gradient is made of select, strided-slice and pad gradients, all
deterministic under XLA. Ties go to the first slice in row-major window
order, the element MaxPool's own gradient picks; where windows overlap, an
input that is the maximum of several of them receives the sum of their
gradients in another order, so gradients agree to float rounding
(tests/test_xla.py).

Only the trainer's model in memory is switched (`use_strided_max_pooling`):
the layers stay keras.layers.MaxPooling2D with their own config, so every
export and checkpoint is the same as before and loads in plain Keras.
"""

from __future__ import annotations

import functools
import math

import keras
import tensorflow as tf


def _padding(size: int, pool: int, stride: int, padding: str) -> tuple[int, int, int]:
    """(outputs, pad before, pad after) along one axis, as TensorFlow's MaxPool pads."""
    if padding == "same":
        outputs = math.ceil(size / stride)
        total = max((outputs - 1) * stride + pool - size, 0)
        return outputs, total // 2, total - total // 2
    return (size - pool) // stride + 1, 0, 0


def strided_max_pool(x, pool_size, strides, padding: str):
    """max_pool2d of an NHWC tensor with known height and width, as a maximum over strided slices."""
    height, width = int(x.shape[1]), int(x.shape[2])
    rows, top, bottom = _padding(height, pool_size[0], strides[0], padding)
    columns, left, right = _padding(width, pool_size[1], strides[1], padding)
    if top or bottom or left or right:
        lowest = tf.constant(-math.inf, x.dtype)
        x = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]], constant_values=lowest)
    result = None
    for i in range(pool_size[0]):
        for j in range(pool_size[1]):
            window = x[:, i:i + (rows - 1) * strides[0] + 1:strides[0], j:j + (columns - 1) * strides[1] + 1:strides[1], :]
            # maximum's gradient goes to its first argument on ties: the earlier window element wins.
            result = window if result is None else tf.maximum(result, window)
    return result


def _max_pooling_layers(layer):
    for child in getattr(layer, "layers", []):
        if isinstance(child, keras.layers.MaxPooling2D):
            yield child
        yield from _max_pooling_layers(child)


def _strided_call(layer, inputs):
    return strided_max_pool(inputs, layer.pool_size, layer.strides, layer.padding)


def use_strided_max_pooling(model: keras.Model) -> int:
    """Make the MaxPooling2D layers of `model` (channels last) compute as `strided_max_pool`, in this
    process only (their config, and so every saved file, is unchanged); returns how many were switched.

    Keras calls a layer through its `call` attribute, so an instance attribute takes precedence over the
    class's method without changing the layer's type."""
    switched = 0
    for layer in _max_pooling_layers(model):
        if layer.data_format == "channels_last":
            layer.call = functools.partial(_strided_call, layer)
            switched += 1
    return switched
