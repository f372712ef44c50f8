"""The architectures as data, plus what can be known about them without building.

STANDARD LIBRARY ONLY: preflight and the CLI use `check_model_input` and
`parameter_counts` to refuse or size a model before TensorFlow is imported.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from deepdanbooru.errors import ModelError, file_field

# The stem conv and max-pool each halve; every stage after the first halves.
_STEM_STRIDES = 2
# resnet_152's head is a 7x7 average pool with padding "valid": anything
# smaller than 7x7 at the end of the trunk leaves nothing to pool.
POOL_SIZE = 7


@dataclass(frozen=True)
class Architecture:
    widths: tuple[int, ...]
    repeats: tuple[int, ...]
    # "dense": 7x7 valid average pool, flatten, dense, sigmoid (resnet_152).
    # "conv": 1x1 conv to n_tags without bias, global average pool, sigmoid.
    # "pooled": global average pool, dense to n_tags with bias, sigmoid.
    head: str
    # "resnet": ours (models.blocks). "convnext", "efficientnetv2": the keras.applications model named by
    # `application`, made of built-in layers (models.applications). "vit": models.vit.
    family: str = "resnet"
    application: str | None = None
    # vit: the input's sides must be multiples of the patch; widths[0] is split across `heads`.
    patch: int = 0
    heads: int = 0


ARCHITECTURES: dict[str, Architecture] = {
    "resnet_152": Architecture((256, 512, 1024, 2048), (2, 7, 35, 2), "dense"),
    "resnet_custom_v1": Architecture((256, 512, 1024, 2048, 4096), (2, 7, 35, 2, 2), "conv"),
    "resnet_custom_v2": Architecture((256, 512, 1024, 1024, 1024, 2048), (2, 7, 40, 16, 16, 6), "conv"),
    "resnet_custom_v3": Architecture((256, 512, 1024, 1024, 2048, 4096), (2, 7, 19, 19, 2, 2), "conv"),
    "resnet_custom_v4": Architecture((256, 512, 1024, 1024, 1024, 2048), (2, 7, 10, 10, 10, 2), "conv"),
    "resnet_small": Architecture((64, 128, 256, 512), (1, 1, 1, 1), "conv"),
    # widths and repeats are the applications' own projection_dims and depths.
    "convnext_tiny": Architecture((96, 192, 384, 768), (3, 3, 9, 3), "pooled", "convnext", "ConvNeXtTiny"),
    "convnext_small": Architecture((96, 192, 384, 768), (3, 3, 27, 3), "pooled", "convnext", "ConvNeXtSmall"),
    # widths: each stage's output filters; the rest of a stage is in EFFICIENTNETV2_STAGES.
    "efficientnetv2_b0": Architecture((16, 32, 48, 96, 112, 192), (1, 2, 2, 3, 5, 8), "pooled",
                                      "efficientnetv2", "EfficientNetV2B0"),
    "efficientnetv2_s": Architecture((24, 48, 64, 128, 160, 256), (2, 4, 4, 6, 9, 15), "pooled",
                                     "efficientnetv2", "EfficientNetV2S"),
    # ViT-S/16 (Dosovitskiy et al.; DeiT-S): width 384, 12 blocks, 6 heads, MLP 4x.
    "vit_small_patch16": Architecture((384,), (12,), "pooled", "vit", patch=16, heads=6),
}


@dataclass(frozen=True)
class ParameterGroups:
    """What a family declares about its layers, by the names its builder gives them (not by weight shapes).

    Depth, for layer_decay: a model is stem, then `units` (the ViT's blocks, the CNNs' stages, counted by
    `unit_count`), then top (final norm, top conv) and the head. `units` maps a layer name to its unit:
    (pattern, offset), the first group of the first matching pattern plus offset. Weight decay: besides
    every bias and every normalization weight, which no family decays, the layers matching `no_decay`
    keep all their weights undecayed (ConvNeXt's layer scales, the ViT's position table).
    """

    stem: str
    units: tuple[tuple[str, int], ...]
    top: str | None = None
    no_decay: str | None = None
    # "stages": one unit per entry of widths; "blocks": repeats[0] units (the ViT).
    unit_count: str = "stages"

    def units_of(self, architecture: Architecture) -> int:
        return architecture.repeats[0] if self.unit_count == "blocks" else len(architecture.widths)

    def unit_of(self, layer_name: str) -> int | None:
        """The unit of a trunk layer; -1 for the stem, None for top layers and names this family never builds."""
        if re.search(self.stem, layer_name):
            return -1
        for pattern, offset in self.units:
            match = re.search(pattern, layer_name)
            if match:
                return int(match.group(1)) + offset
        return None

    def is_top(self, layer_name: str) -> bool:
        return self.top is not None and re.search(self.top, layer_name) is not None

    def decays(self, layer_name: str) -> bool:
        return self.no_decay is None or re.search(self.no_decay, layer_name) is None


PARAMETER_GROUPS: dict[str, ParameterGroups] = {
    # models.blocks: stem_*, stage{1..}_block{j}_*.
    "resnet": ParameterGroups(stem=r"^stem_", units=((r"^stage(\d+)_", -1),)),
    # keras.applications' names behind the model's: *_stem_*, *_stage_{0..}_block_{j}_*, the downsampling
    # before stage i+1 numbered i, the final layer norm auto-named; layer scales are 1x1 depthwise kernels.
    "convnext": ParameterGroups(stem=r"_stem_", units=((r"_stage_(\d+)_block_", 0),
                                                      (r"_downsampling_(?:conv|layernorm)_(\d+)$", 1)),
                                top=r"_layer_normalization_\d+$", no_decay=r"_layer_scale$"),
    # keras.applications: stem_*, block{1..}{a..}_*, top_*.
    "efficientnetv2": ParameterGroups(stem=r"^stem_", units=((r"^block(\d+)[a-z]_", -1),), top=r"^top_"),
    # models.vit: the patch and position embeddings, vit_block{0..}_*, vit_norm.
    "vit": ParameterGroups(stem=r"^vit_(?:patch|position)_embedding$", units=((r"^vit_block(\d+)_", 0),),
                           top=r"^vit_norm$", no_decay=r"^vit_position_embedding$", unit_count="blocks"),
}

# The EfficientNetV2 stages as keras.applications builds them (width and depth coefficients 1.0 for
# both): (stem filters, ((kernel, expand ratio, stride, squeeze-excite ratio, fused), ...)), one
# entry per stage, in the order of the row's widths and repeats; the top conv has 1280 filters.
EFFICIENTNETV2_STAGES = {
    "efficientnetv2_b0": (32, ((3, 1, 1, 0.0, True), (3, 4, 2, 0.0, True), (3, 4, 2, 0.0, True),
                               (3, 4, 2, 0.25, False), (3, 6, 1, 0.25, False), (3, 6, 2, 0.25, False))),
    "efficientnetv2_s": (24, ((3, 1, 1, 0.0, True), (3, 4, 2, 0.0, True), (3, 4, 2, 0.0, True),
                              (3, 4, 2, 0.25, False), (3, 6, 1, 0.25, False), (3, 6, 2, 0.25, False))),
}
EFFICIENTNETV2_TOP = 1280
# keras.applications refuses inputs under 32x32; ConvNeXt's valid strided convs need 32 to leave 1x1.
APPLICATION_MINIMUM = 32


def model_names() -> tuple[str, ...]:
    return tuple(ARCHITECTURES)


def get_architecture(name: str, source=None) -> Architecture:
    """The table row for `name`; an unknown name is a ModelError listing the valid ones."""
    try:
        return ARCHITECTURES[name]
    except (KeyError, TypeError):
        pass
    close = difflib.get_close_matches(str(name), list(ARCHITECTURES), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    message = f"unknown model {name!r}{hint}; valid models: {', '.join(ARCHITECTURES)}"
    raise ModelError(file_field(source, "model", message) if source else message)


def _halve(size: int) -> int:
    # A stride-2 conv or pool with padding "same" gives ceil(size / 2).
    return -(-size // 2)


def final_feature_size(name: str, height: int, width: int) -> tuple[int, int]:
    """Spatial size of the trunk's last feature map for an input of height x width."""
    architecture = get_architecture(name)
    halvings = _STEM_STRIDES + len(architecture.widths) - 1
    for _ in range(halvings):
        height, width = _halve(height), _halve(width)
    return height, width


def head_has_bias(name: str) -> bool:
    """Whether the model's output layer has a bias (head_bias_init log_prior needs one)."""
    return get_architecture(name).head in ("dense", "pooled")


def check_head_bias_init(name: str, head_bias_init: str, source=None) -> None:
    """Refuse log_prior for a model whose head has no bias to set."""
    if head_bias_init == "log_prior" and not head_has_bias(name):
        message = (f"log_prior sets the output bias, but {name}'s head (1x1 convolution) has none; use \"zeros\", "
                   "or a model whose head has a bias (resnet_152, the convnext, efficientnetv2 and vit rows)")
        raise ModelError(file_field(source, "head_bias_init", message) if source else message)


def minimum_input_size(name: str) -> int:
    """Smallest height (or width) the model accepts."""
    architecture = get_architecture(name)
    if architecture.family == "vit":
        return architecture.patch
    if architecture.application:
        return APPLICATION_MINIMUM
    if architecture.head != "dense":
        return 1
    halvings = _STEM_STRIDES + len(architecture.widths) - 1
    return (POOL_SIZE - 1) * 2**halvings + 1


def _why_too_small(name: str, architecture: Architecture, height: int, width: int) -> str:
    if architecture.application:
        return f"(keras.applications' {architecture.application} takes nothing smaller)"
    final = final_feature_size(name, height, width)
    return (f"(its final feature map must be at least {POOL_SIZE}x{POOL_SIZE} for the {POOL_SIZE}x{POOL_SIZE} "
            f"average pool); {height}x{width} gives {final[0]}x{final[1]}")


def check_model_input(name: str, input_shape, source=None) -> Architecture:
    """Refuse, before anything is built, a name or an input shape the model cannot take.

    `source` (e.g. the project.json path) prefixes the message so the user
    knows which file to fix.
    """
    architecture = get_architecture(name, source)

    def fail(field, message):
        raise ModelError(file_field(source, field, message) if source else message)

    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        fail("input_shape", f"input shape must be (height, width, channels) of positive integers, got {shape}")
    height, width, _ = shape
    patch = architecture.patch
    if patch and (height % patch or width % patch):
        fail("image_width/image_height",
             f"{name} cuts the image into {patch}x{patch} patches: height and width must be multiples of "
             f"{patch}, got {height}x{width}")
    minimum = minimum_input_size(name)
    if height < minimum or width < minimum:
        fail("image_width/image_height",
             f"{name} needs an input of at least {minimum}x{minimum} "
             f"{_why_too_small(name, architecture, height, width)}")
    return architecture


def parameter_counts(name: str, input_shape, n_tags: int) -> tuple[int, int]:
    """(trainable, non_trainable) of build_model(name, input_shape, n_tags), computed from the table.

    The ResNets here, the other families in models.counts. Batch norm has 2
    trainable (gamma, beta) and 2 non-trainable (moving mean, variance)
    weights per channel; the ResNets' convolutions have no bias.
    """
    architecture = check_model_input(name, input_shape)
    if architecture.family != "resnet":
        from deepdanbooru.models import counts

        return counts.COUNTERS[architecture.family](name, architecture, tuple(input_shape), n_tags)
    height, width, channels = input_shape
    trainable = non_trainable = 0

    def conv(kernel, c_in, c_out):
        nonlocal trainable
        trainable += kernel * kernel * c_in * c_out

    def batch_norm(c):
        nonlocal trainable, non_trainable
        trainable += 2 * c
        non_trainable += 2 * c

    c_in = architecture.widths[0] // 4
    conv(7, channels, c_in)
    batch_norm(c_in)
    for width_f, repeat in zip(architecture.widths, architecture.repeats):
        inner = width_f // 4
        for block in range(repeat + 1):
            source = c_in if block == 0 else width_f
            conv(1, source, inner)
            batch_norm(inner)
            conv(3, inner, inner)
            batch_norm(inner)
            conv(1, inner, width_f)
            batch_norm(width_f)
            if block == 0:
                conv(1, c_in, width_f)
                batch_norm(width_f)
        c_in = width_f

    if architecture.head == "dense":
        final_h, final_w = final_feature_size(name, height, width)
        pooled = (final_h // POOL_SIZE) * (final_w // POOL_SIZE)
        trainable += c_in * pooled * n_tags + n_tags
    else:
        conv(1, c_in, n_tags)
    return trainable, non_trainable
