"""Keras pieces the imported families share, all built-in layers so a plain load_model opens the result.

- A free-standing parameter (class token, register tokens, MAP latent) is
  the kernel of a bias-free Dense reading a constant 1 derived from the
  input: its output is exactly the kernel, and the weight trains like any other.
- timm's gelu_tanh has no built-in Keras name (Activation("gelu") is the
  exact erf form), so it is written out: x * sigmoid(2 * sqrt(2 / pi) *
  (x + 0.044715 x^3)), which equals 0.5 x (1 + tanh(sqrt(2 / pi) (...))).
- The checkpoint's mean, standard deviation and channel order fold into the
  first convolution, which reads [0, 1] RGB: the patch or stem convolution
  has no padding, so the fold is exact.
"""

from __future__ import annotations

import math

import numpy as np
from keras import layers, ops

from deepdanbooru.errors import ModelError, file_field

_GELU_TANH_CUBIC = 0.044715
_GELU_TANH_SCALE = 2.0 * math.sqrt(2.0 / math.pi)
# timm names -> what builds them; "gelu" is torch's exact GELU.
ACTIVATIONS = ("gelu", "gelu_tanh")


def fail(path, field: str, message: str):
    raise ModelError(file_field(path, f"model_args.{field}", message))


def merged_args(architecture: str, model_args: dict, known, defaults: dict, path) -> dict:
    """The architecture's defaults with model_args over them; an argument the family does not know is refused,
    and so is an image that is not RGB. The activation is checked here too (every family takes act_layer)."""
    unknown = sorted(set(model_args) - set(known))
    if unknown:
        fail(path, unknown[0], f"is not supported for {architecture} (supported: {', '.join(known)})")
    args = {"in_chans": 3, "act_layer": "gelu", **defaults, **model_args}
    if args["in_chans"] != 3:
        fail(path, "in_chans", f"must be 3 (RGB images), got {args['in_chans']!r}")
    args["act_layer"] = args["act_layer"] or "gelu"
    if args["act_layer"] not in ACTIVATIONS:
        fail(path, "act_layer", f"{args['act_layer']!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return args


def ones_like_batch(image):
    """(batch, 1) ones that depend on the input, so Dense layers reading them stay in the graph."""
    return ops.ones_like(image[:, 0, 0, :1])


def parameter(ones, shape: tuple[int, ...], name: str):
    """A learned tensor of `shape`, repeated for every image: (batch, *shape)."""
    flat = layers.Dense(int(np.prod(shape)), use_bias=False, name=name)(ones)
    return layers.Reshape(tuple(shape), name=f"{name}_shape")(flat)


def constant(ones, shape: tuple[int, ...], name: str):
    """A fixed tensor of `shape` (set at import), repeated for every image: a non-trainable `parameter`."""
    flat = layers.Dense(int(np.prod(shape)), use_bias=False, trainable=False, name=name)(ones)
    return layers.Reshape(tuple(shape), name=f"{name}_shape")(flat)


def activation(x, kind: str, name: str):
    if kind == "gelu":
        return layers.Activation("gelu", name=name)(x)
    if kind != "gelu_tanh":
        raise ModelError(f"activation {kind!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    cube = layers.Multiply(name=f"{name}_cube")([x, x, x])
    inner = layers.Add(name=f"{name}_inner")([x, layers.Rescaling(_GELU_TANH_CUBIC, name=f"{name}_cubic")(cube)])
    gate = layers.Rescaling(_GELU_TANH_SCALE, name=f"{name}_scale")(inner)
    gate = layers.Activation("sigmoid", name=f"{name}_gate")(gate)
    return layers.Multiply(name=name)([x, gate])


def fold_input(kernel: np.ndarray, bias: np.ndarray, mean, std, channel_order: str,
               reference_mean=(0.0, 0.0, 0.0), reference_std=(1.0, 1.0, 1.0)):
    """The (kh, kw, 3, out) kernel and bias of a convolution reading RGB, whose input the model before it
    normalised with `reference_mean` / `reference_std` (identity: raw [0, 1]), that computes what the
    checkpoint's convolution computes on its own input: channels in `channel_order`, (x - mean) / std.
    """
    kernel = np.asarray(kernel, dtype=np.float64)
    if channel_order == "bgr":
        # The checkpoint's input channel c is our channel 2 - c; its mean and std are listed in its order.
        kernel = kernel[:, :, ::-1, :]
        mean, std = tuple(mean)[::-1], tuple(std)[::-1]
    mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    ref_mean, ref_std = np.asarray(reference_mean, np.float64), np.asarray(reference_std, np.float64)
    # Our input to the conv is r = (x - ref_mean) / ref_std; the checkpoint wants (x - mean) / std
    # = r * ref_std / std + (ref_mean - mean) / std.
    scale = ref_std / std
    shift = (ref_mean - mean) / std
    folded = kernel * scale[None, None, :, None]
    bias = np.asarray(bias, np.float64) + np.einsum("hwco,c->o", kernel, shift)
    return folded.astype(np.float32), bias.astype(np.float32)


def resample_grid(table: np.ndarray, grid: tuple[int, int], wanted: tuple[int, int]) -> np.ndarray:
    """Rows of a per-patch table laid out on `grid` (row-major), resampled bicubically onto `wanted`."""
    if tuple(grid) == tuple(wanted):
        return table
    import tensorflow as tf

    image = tf.constant(table.reshape(1, *grid, -1))
    return tf.image.resize(image, wanted, method="bicubic").numpy().reshape(wanted[0] * wanted[1], -1)
