"""timm's ConvNeXt: options from (architecture, model_args), the Keras builder, the weight table.

Layer names are keras.applications' (the registry's convnext rows replay that
model, models.applications), so one table fills either: stem conv and norm,
per stage a LayerNorm + 2x2 stride-2 conv downsampling, blocks of depthwise
conv, LayerNorm, two pointwise Dense layers and a layer scale (a bias-free
1x1 DepthwiseConv2D holding gamma). timm's head is pool -> norm -> fc, or
with head_norm_first norm -> pool -> fc.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import layers

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import parts

EPSILON = 1e-6  # timm's LayerNorm / LayerNorm2d
# name -> (depths, dims, other model_args its timm function sets)
SIZES = {
    "atto": ((2, 2, 6, 2), (40, 80, 160, 320), {"conv_mlp": True}),
    "femto": ((2, 2, 6, 2), (48, 96, 192, 384), {"conv_mlp": True}),
    "pico": ((2, 2, 6, 2), (64, 128, 256, 512), {"conv_mlp": True}),
    "nano": ((2, 2, 8, 2), (80, 160, 320, 640), {"conv_mlp": True}),
    "tiny": ((3, 3, 9, 3), (96, 192, 384, 768), {}),
    "tiny_hnf": ((3, 3, 9, 3), (96, 192, 384, 768), {"head_norm_first": True, "conv_mlp": True}),
    "small": ((3, 3, 27, 3), (96, 192, 384, 768), {}),
    "base": ((3, 3, 27, 3), (128, 256, 512, 1024), {}),
    "large": ((3, 3, 27, 3), (192, 384, 768, 1536), {}),
    "xlarge": ((3, 3, 27, 3), (256, 512, 1024, 2048), {}),
    "xxlarge": ((3, 4, 30, 3), (384, 768, 1536, 3072), {"norm_eps": 1e-5}),
}
SUPPORTED = "convnext_{" + ",".join(SIZES) + "}"
_TRAINING_ONLY = ("drop_rate", "drop_path_rate", "head_init_scale")
_KNOWN = ("depths", "dims", "act_layer", "head_norm_first", "ls_init_value", "conv_mlp", "kernel_sizes",
          "patch_size", "conv_bias", "norm_eps", "in_chans", "num_classes", "global_pool", "output_stride",
          ) + _TRAINING_ONLY
STAGES = 4
# The stem divides by its patch and each later stage halves (valid convolutions).
_DOWNSAMPLINGS = STAGES - 1


@dataclass(frozen=True)
class ConvNeXtOptions:
    depths: tuple[int, ...]
    dims: tuple[int, ...]
    act: str
    head_norm_first: bool
    conv_mlp: bool  # only the shape of the pointwise weights: (out, in, 1, 1) instead of (out, in)
    kernels: tuple[int, ...]  # the depthwise kernel of each stage
    patch: int
    bias: bool
    epsilon: float
    num_classes: int


def options(architecture: str, model_args: dict, num_classes: int, path) -> ConvNeXtOptions:
    size = architecture.removeprefix("convnext_")
    if size not in SIZES:
        raise ModelError(file_field(path, "architecture", f"{architecture!r} is not a supported ConvNeXt "
                                                          f"({SUPPORTED})"))
    depths, dims, extra = SIZES[size]
    args = parts.merged_args(architecture, model_args, _KNOWN, {
        "depths": depths, "dims": dims, "head_norm_first": False, "conv_mlp": False, "kernel_sizes": 7,
        "patch_size": 4, "conv_bias": True, "norm_eps": None, "global_pool": "avg", "output_stride": 32, **extra},
        path)

    def fail(field, message):
        parts.fail(path, field, message)

    for field in ("depths", "dims"):
        value = args[field]
        if (not isinstance(value, (list, tuple)) or len(value) != STAGES
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
            fail(field, f"must be {STAGES} positive integers, got {value!r}")
    if args["global_pool"] != "avg":
        fail("global_pool", f"{args['global_pool']!r} is not supported (avg)")
    if args["output_stride"] != 32:
        fail("output_stride", f"{args['output_stride']!r} is not supported (32)")
    kernels = args["kernel_sizes"]
    kernels = (kernels,) * STAGES if isinstance(kernels, int) else kernels
    if (not isinstance(kernels, (list, tuple)) or len(kernels) != STAGES
            or not all(isinstance(k, int) and k > 0 and k % 2 for k in kernels)):
        fail("kernel_sizes", f"must be an odd integer or {STAGES} of them, got {args['kernel_sizes']!r}")
    act = args["act_layer"]
    epsilon = EPSILON if args["norm_eps"] is None else float(args["norm_eps"])
    return ConvNeXtOptions(tuple(args["depths"]), tuple(args["dims"]), act, bool(args["head_norm_first"]),
                           bool(args["conv_mlp"]), tuple(kernels),
                           args["patch_size"], bool(args["conv_bias"]), epsilon, num_classes)


def input_size(opts: ConvNeXtOptions, pretrained_size, path=None) -> tuple[int, int]:
    minimum = opts.patch * 2**_DOWNSAMPLINGS
    if min(pretrained_size) < minimum:
        raise ModelError(file_field(path, "pretrained_cfg.input_size", f"{list(pretrained_size)}: this ConvNeXt "
                                                                       f"needs at least {minimum}x{minimum}"))
    return tuple(pretrained_size)


def _norm(opts, name):
    return layers.LayerNormalization(epsilon=opts.epsilon, name=name)


def build(opts: ConvNeXtOptions, name: str, size) -> keras.Model:
    image = keras.Input(shape=(*size, 3), name="image")
    # With a bias even where the checkpoint's stem has none: folding a mean into it makes one.
    x = layers.Conv2D(opts.dims[0], opts.patch, strides=opts.patch, name=f"{name}_stem_conv")(image)
    x = _norm(opts, f"{name}_stem_layernorm")(x)
    for stage, (depth, width) in enumerate(zip(opts.depths, opts.dims)):
        if stage:
            x = _norm(opts, f"{name}_downsampling_layernorm_{stage - 1}")(x)
            x = layers.Conv2D(width, 2, strides=2, use_bias=opts.bias, name=f"{name}_downsampling_conv_{stage - 1}")(x)
        for index in range(depth):
            block = f"{name}_stage_{stage}_block_{index}"
            y = layers.DepthwiseConv2D(opts.kernels[stage], padding="same", use_bias=opts.bias,
                                       name=f"{block}_depthwise_conv")(x)
            y = _norm(opts, f"{block}_layernorm")(y)
            y = layers.Dense(4 * width, name=f"{block}_pointwise_conv_1")(y)
            y = parts.activation(y, opts.act, f"{block}_{opts.act}")
            y = layers.Dense(width, name=f"{block}_pointwise_conv_2")(y)
            # timm's ls_init_value sets gamma's initial value; null means its default, so every block has one.
            y = layers.DepthwiseConv2D(1, use_bias=False, name=f"{block}_layer_scale")(y)
            x = layers.Add(name=f"{block}_add")([x, y])
    if opts.head_norm_first:
        x = _norm(opts, f"{name}_layer_normalization_0")(x)
        x = layers.GlobalAveragePooling2D(name="head_pool")(x)
    else:
        x = layers.GlobalAveragePooling2D(name="head_pool")(x)
        x = _norm(opts, f"{name}_head_layernorm")(x)
    x = layers.Dense(opts.num_classes, name="head_dense")(x)
    outputs = layers.Activation("sigmoid", dtype="float32", name="output")(x)
    return keras.Model(image, outputs, name=name)


# --- the weight table ---

def _conv_tensors(prefix, out_ch, in_ch, kernel, bias):
    shapes = {f"{prefix}.weight": (out_ch, in_ch, kernel, kernel)}
    if bias:
        shapes[f"{prefix}.bias"] = (out_ch,)
    return shapes


def _norm_tensors(prefix, width):
    return {f"{prefix}.weight": (width,), f"{prefix}.bias": (width,)}


def expected_tensors(opts: ConvNeXtOptions, head: bool = True) -> dict[str, tuple[int, ...]]:
    out = _conv_tensors("stem.0", opts.dims[0], 3, opts.patch, opts.bias)
    out.update(_norm_tensors("stem.1", opts.dims[0]))
    point = (1, 1) if opts.conv_mlp else ()
    for stage, (depth, width) in enumerate(zip(opts.depths, opts.dims)):
        if stage:
            out.update(_norm_tensors(f"stages.{stage}.downsample.0", opts.dims[stage - 1]))
            out.update(_conv_tensors(f"stages.{stage}.downsample.1", width, opts.dims[stage - 1], 2, opts.bias))
        for index in range(depth):
            block = f"stages.{stage}.blocks.{index}"
            out.update(_conv_tensors(f"{block}.conv_dw", width, 1, opts.kernels[stage], opts.bias))
            out.update(_norm_tensors(f"{block}.norm", width))
            out.update({f"{block}.mlp.fc1.weight": (4 * width, width, *point), f"{block}.mlp.fc1.bias": (4 * width,),
                        f"{block}.mlp.fc2.weight": (width, 4 * width, *point), f"{block}.mlp.fc2.bias": (width,),
                        f"{block}.gamma": (width,)})
    out.update(_norm_tensors("norm_pre" if opts.head_norm_first else "head.norm", opts.dims[-1]))
    if head:
        out.update({"head.fc.weight": (opts.num_classes, opts.dims[-1]), "head.fc.bias": (opts.num_classes,)})
    return out


def _with_bias(t, prefix, kernel):
    return [kernel, t[f"{prefix}.bias"]] if f"{prefix}.bias" in t else [kernel]


def _conv(t, prefix):
    return _with_bias(t, prefix, t[f"{prefix}.weight"].transpose(2, 3, 1, 0))


def _pointwise(t, prefix):
    weight = t[f"{prefix}.weight"]
    return [weight.reshape(weight.shape[:2]).T, t[f"{prefix}.bias"]]


def _norm_weights(t, prefix):
    return [t[f"{prefix}.weight"], t[f"{prefix}.bias"]]


def trunk_weights(opts: ConvNeXtOptions, t: dict, name: str) -> dict[str, list[np.ndarray]]:
    """Layer name -> weights for everything after the stem conv and before the head's norm."""
    out = {f"{name}_stem_layernorm": _norm_weights(t, "stem.1")}
    for stage, depth in enumerate(opts.depths):
        if stage:
            out[f"{name}_downsampling_layernorm_{stage - 1}"] = _norm_weights(t, f"stages.{stage}.downsample.0")
            out[f"{name}_downsampling_conv_{stage - 1}"] = _conv(t, f"stages.{stage}.downsample.1")
        for index in range(depth):
            source, block = f"stages.{stage}.blocks.{index}", f"{name}_stage_{stage}_block_{index}"
            # torch's depthwise (C, 1, k, k) is Keras' (k, k, C, 1).
            out[f"{block}_depthwise_conv"] = _with_bias(t, f"{source}.conv_dw",
                                                        t[f"{source}.conv_dw.weight"].transpose(2, 3, 0, 1))
            out[f"{block}_layernorm"] = _norm_weights(t, f"{source}.norm")
            out[f"{block}_pointwise_conv_1"] = _pointwise(t, f"{source}.mlp.fc1")
            out[f"{block}_pointwise_conv_2"] = _pointwise(t, f"{source}.mlp.fc2")
            out[f"{block}_layer_scale"] = [t[f"{source}.gamma"].reshape(1, 1, -1, 1)]
    return out


def stem_kernel(t: dict) -> tuple[np.ndarray, np.ndarray]:
    kernel = t["stem.0.weight"].transpose(2, 3, 1, 0)
    return kernel, t.get("stem.0.bias", np.zeros(kernel.shape[-1], np.float32))


def layer_weights(opts: ConvNeXtOptions, t: dict, fold, name: str) -> dict[str, list[np.ndarray]]:
    out = {f"{name}_stem_conv": list(fold(*stem_kernel(t)))}
    out.update(trunk_weights(opts, t, name))
    if opts.head_norm_first:
        out[f"{name}_layer_normalization_0"] = _norm_weights(t, "norm_pre")
    else:
        out[f"{name}_head_layernorm"] = _norm_weights(t, "head.norm")
    out["head_dense"] = [t["head.fc.weight"].T, t["head.fc.bias"]]
    return out
