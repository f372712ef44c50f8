"""Building blocks of the ResNets and the heads of every family: built-in Keras layers only, named stably.

Built-in layers keep exports loadable by plain `keras.models.load_model`;
stable names let checkpoints and --source-model weights line up by name.
Every initializer gets its own explicit seed derived from (model seed, layer
name), so initial weights never depend on Keras' global random state.
"""

from __future__ import annotations

import hashlib

import keras
from keras import layers

from deepdanbooru.models.table import get_architecture
from deepdanbooru.registry import POOL_SIZE


def layer_seed(seed: int, name: str) -> int:
    """A 31-bit seed that is a pure function of (seed, name), the same in every process."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def conv_bn(x, filters, kernel, strides, name, seed, relu=True, zero_gamma=False):
    """Conv (no bias, he_normal, same padding) + batch norm (+ relu)."""
    x = layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer=keras.initializers.HeNormal(seed=layer_seed(seed, name + "_conv")),
        name=name + "_conv",
    )(x)
    # Zero gamma on a residual branch's last norm makes each block start as
    # the identity, which keeps very deep stacks trainable from step one.
    x = layers.BatchNormalization(
        gamma_initializer="zeros" if zero_gamma else "ones", name=name + "_bn"
    )(x)
    if relu:
        x = layers.Activation("relu", name=name + "_relu")(x)
    return x


def bottleneck(x, filters, name, seed, strides=1, project=False):
    """1x1 to F/4, 3x3 at F/4 (strided), 1x1 to F, add the (projected) shortcut, relu."""
    inner = filters // 4
    shortcut = x
    if project:
        shortcut = conv_bn(x, filters, 1, strides, name + "_shortcut", seed, relu=False)
    y = conv_bn(x, inner, 1, 1, name + "_1", seed)
    y = conv_bn(y, inner, 3, strides, name + "_2", seed)
    y = conv_bn(y, filters, 1, 1, name + "_3", seed, relu=False, zero_gamma=True)
    y = layers.Add(name=name + "_add")([shortcut, y])
    return layers.Activation("relu", name=name + "_out")(y)


def stem(x, filters, seed):
    x = conv_bn(x, filters, 7, 2, "stem", seed)
    return layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)


def stage(x, filters, repeat, index, seed):
    """One entry block with a projection shortcut (stride 1 in the first stage), then `repeat` blocks."""
    strides = 1 if index == 1 else 2
    x = bottleneck(x, filters, f"stage{index}_block0", seed, strides=strides, project=True)
    for block in range(1, repeat + 1):
        x = bottleneck(x, filters, f"stage{index}_block{block}", seed)
    return x


def trunk(name, image, seed):
    """The ResNet trunk of the registry's row `name`: stem, then one stage per entry of its widths."""
    architecture = get_architecture(name)
    x = stem(image, architecture.widths[0] // 4, seed)
    for index, (width, repeat) in enumerate(zip(architecture.widths, architecture.repeats), start=1):
        x = stage(x, width, repeat, index, seed)
    return x


def conv_head(x, n_tags, seed):
    x = layers.Conv2D(
        n_tags,
        1,
        padding="same",
        use_bias=False,
        kernel_initializer=keras.initializers.HeNormal(seed=layer_seed(seed, "head_conv")),
        name="head_conv",
    )(x)
    return layers.GlobalAveragePooling2D(name="head_pool")(x)


def _head_dense(x, n_tags, seed):
    return layers.Dense(
        n_tags,
        kernel_initializer=keras.initializers.GlorotUniform(seed=layer_seed(seed, "head_dense")),
        name="head_dense",
    )(x)


def dense_head(x, n_tags, seed):
    x = layers.AveragePooling2D(POOL_SIZE, padding="valid", name="head_pool")(x)
    return _head_dense(layers.Flatten(name="head_flatten")(x), n_tags, seed)


def pooled_head(x, n_tags, seed):
    return _head_dense(layers.GlobalAveragePooling2D(name="head_pool")(x), n_tags, seed)

