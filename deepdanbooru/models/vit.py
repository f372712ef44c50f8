"""A Vision Transformer trunk from built-in Keras layers (pre-norm blocks, mean-pooled tokens).

Patch embedding is a convolution with kernel and stride equal to the patch;
the token grid is (height / patch) x (width / patch), so any input whose
sides are multiples of the patch works, and the learned position embedding
is sized for that grid when the model is built. The trunk hands the head the
final tokens reshaped back into that grid: the head's global average pool is
then the mean over tokens, and grad-cam finds a 4-D map as in a CNN (the
map is one cell per patch).
"""

from __future__ import annotations

import keras
from keras import layers, ops

from deepdanbooru.models.blocks import layer_seed
from deepdanbooru.models.table import get_architecture

_NORM_EPSILON = 1e-6
_MLP_RATIO = 4


def _normal(seed, name, stddev=0.02):
    # ViT's truncated normal (timm's trunc_normal_(std=.02)) for embeddings and projections.
    return keras.initializers.TruncatedNormal(stddev=stddev, seed=layer_seed(seed, name))


def _dense(units, name, seed, activation=None):
    return layers.Dense(units, activation=activation, kernel_initializer=_normal(seed, name), name=name)


def _position_embedding(tokens, count: int, width: int, seed: int):
    """A learned (count, width) table added to every image's tokens.

    Built-in layers hold no free-standing weight, so the table is the kernel
    of a bias-free Dense reading a constant 1 (derived from the input, to stay
    in the graph): its output is exactly the kernel.
    """
    one = ops.ones_like(tokens[:, :1, 0])
    table = layers.Dense(count * width, use_bias=False, kernel_initializer=_normal(seed, "vit_position_embedding"),
                         name="vit_position_embedding")(one)
    table = layers.Reshape((count, width), name="vit_position_table")(table)
    return layers.Add(name="vit_embedded")([tokens, table])


def _block(x, index: int, width: int, heads: int, seed: int):
    name = f"vit_block{index}"
    y = layers.LayerNormalization(epsilon=_NORM_EPSILON, name=f"{name}_norm1")(x)
    # Seeded so that building draws nothing from Keras' global random state; seed_attention then
    # gives the four projections distinct kernels.
    attention = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attention",
                                          kernel_initializer=_normal(seed, f"{name}_attention"))
    y = attention(y, y)
    x = layers.Add(name=f"{name}_add1")([x, y])
    y = layers.LayerNormalization(epsilon=_NORM_EPSILON, name=f"{name}_norm2")(x)
    y = _dense(_MLP_RATIO * width, f"{name}_mlp1", seed, activation="gelu")(y)
    y = _dense(width, f"{name}_mlp2", seed)(y)
    return layers.Add(name=f"{name}_add2")([x, y])


def trunk(name: str, image, seed: int):
    architecture = get_architecture(name)
    width, depth, patch, heads = architecture.widths[0], architecture.repeats[0], architecture.patch, architecture.heads
    height, width_px = int(image.shape[1]), int(image.shape[2])
    grid = (height // patch, width_px // patch)
    # The usual ViT input scaling: [0, 1] to [-1, 1].
    x = layers.Rescaling(2.0, offset=-1.0, name="preprocess")(image)
    patch_seed = layer_seed(seed, "vit_patch_embedding")
    x = layers.Conv2D(width, patch, strides=patch, padding="valid", name="vit_patch_embedding",
                      kernel_initializer=keras.initializers.LecunNormal(seed=patch_seed))(x)
    x = layers.Reshape((grid[0] * grid[1], width), name="vit_tokens")(x)
    x = _position_embedding(x, grid[0] * grid[1], width, seed)
    for index in range(depth):
        x = _block(x, index, width, heads, seed)
    x = layers.LayerNormalization(epsilon=_NORM_EPSILON, name="vit_norm")(x)
    return layers.Reshape((*grid, width), name="vit_token_grid")(x)


def seed_attention(model: keras.Model, seed: int) -> None:
    """Give each attention projection its own seeded initial kernel.

    MultiHeadAttention hands one initializer config to its four projections,
    so a seeded initializer would start query, key and value equal.
    """
    for layer in model.layers:
        if not isinstance(layer, layers.MultiHeadAttention):
            continue
        for part in ("query", "key", "value", "output"):
            kernel = getattr(layer, f"{part}_dense").kernel
            initializer = _normal(seed, f"{layer.name}/{part}")
            kernel.assign(initializer(kernel.shape, dtype=kernel.dtype))
