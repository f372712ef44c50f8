"""The model registry: each model name with its configuration and builders, in one place.

STANDARD LIBRARY ONLY: project.json validation, preflight and `deepdanbooru
--help` read it before TensorFlow starts. A model is one `register_model`
call (its family, head and static configuration); what the models of a family
share (the trunk builder, the parameter counter, the parameter groups) is one
`Family`. Builders are named as "module:function" and imported on first use
(`resolve`), so nothing here imports Keras.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

# resnet_152's head is a 7x7 average pool with padding "valid": anything
# smaller than 7x7 at the end of the trunk leaves nothing to pool.
POOL_SIZE = 7
# keras.applications refuses inputs under 32x32; ConvNeXt's valid strided convs need 32 to leave 1x1.
APPLICATION_MINIMUM = 32


@dataclass(frozen=True)
class ParameterGroups:
    """What a family declares about its layers, by the names its builder gives them (not by weight shapes).

    Depth, for layer_decay: a model is stem, then units (the ViT's blocks, the CNNs' and SwinV2's stages,
    counted on the model itself), then top (final norm, top conv) and the head. `units` maps a layer name to its unit:
    (pattern, offset), the first group of the first matching pattern plus offset. Weight decay: besides
    every bias and every normalization weight, which no family decays, the layers matching `no_decay`
    keep all their weights undecayed (ConvNeXt's layer scales, the ViT's position table). `unit`: what a unit
    is called in messages (trainable_blocks counts them).
    """

    stem: str
    units: tuple[tuple[str, int], ...]
    top: str | None = None
    no_decay: str | None = None
    unit: str = "stage"

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


@dataclass(frozen=True)
class Family:
    # trunk(name, image tensor, seed) -> the last feature map, which the model's head reads (Keras).
    trunk: str
    # counter(name, architecture, input_shape, n_tags) -> (trainable, non_trainable) without building (stdlib).
    counter: str
    groups: ParameterGroups
    # finish(model, seed), once the model is assembled, or None.
    finish: str | None = None


# Layer names shared by the registry's ViT (models.vit) and import-model's ViT and EVA02 (models.timm.vit,
# models.timm.eva02), which add the class and register tokens to the stem, and the final norm's alternatives
# (fc_norm, the MAP pooling) to the top. EVA02's rotary tables (vit_rope_*) are constants, never trained.
_VIT_GROUPS = ParameterGroups(
    stem=r"^vit_(?:patch_embedding|position_embedding|class_token|register_tokens)$",
    units=((r"^vit_block(\d+)_", 0),), top=r"^vit_(?:norm|fc_norm|map_[a-z_\d]+)$",
    no_decay=r"^vit_(?:position_embedding|class_token|register_tokens|map_latent)$", unit="block")

FAMILIES: dict[str, Family] = {
    # models.blocks: ours; stem_*, stage{1..}_block{j}_*.
    "resnet": Family("deepdanbooru.models.blocks:trunk", "deepdanbooru.models.counts:resnet",
                     ParameterGroups(stem=r"^stem_", units=((r"^stage(\d+)_", -1),))),
    # The keras.applications model named by the row's `application`, replayed from built-in layers
    # (models.applications). Its names behind the model's: *_stem_*, *_stage_{0..}_block_{j}_*, the
    # downsampling before stage i+1 numbered i, the final layer norm auto-named (import-model's ConvNeXt names
    # it so too, or *_head_layernorm after the pooling); layer scales are 1x1 depthwise kernels.
    "convnext": Family("deepdanbooru.models.applications:trunk", "deepdanbooru.models.counts:convnext",
                       ParameterGroups(stem=r"_stem_", units=((r"_stage_(\d+)_block_", 0),
                                                             (r"_downsampling_(?:conv|layernorm)_(\d+)$", 1)),
                                       top=r"_(?:layer_normalization_\d+|head_layernorm)$",
                                       no_decay=r"_layer_scale$")),
    # keras.applications: stem_*, block{1..}{a..}_*, top_*.
    "efficientnetv2": Family("deepdanbooru.models.applications:trunk", "deepdanbooru.models.counts:efficientnetv2",
                             ParameterGroups(stem=r"^stem_", units=((r"^block(\d+)[a-z]_", -1),), top=r"^top_")),
    # models.vit: the patch and position embeddings, vit_block{0..}_*, vit_norm.
    "vit": Family("deepdanbooru.models.vit:trunk", "deepdanbooru.models.counts:vit", _VIT_GROUPS,
                  finish="deepdanbooru.models.vit:seed_attention"),
}


# Every family's parameter groups, the registry's and those of the families only import-model builds, in the
# order layer_decay and weight decay try them on a model they are given (models.optimizers.groups_of).
PARAMETER_GROUPS: dict[str, ParameterGroups] = {
    **{name: family.groups for name, family in FAMILIES.items()},
    # models.timm.swinv2: swin_patch_embedding and its norm, swin_stage{s}_block{j}_*, the patch merging in front
    # of stage s (swin_merge{s}_*) as part of stage s, swin_norm; the attention's logit scale and position bias
    # table keep their values (timm's no_weight_decay).
    "swinv2": ParameterGroups(stem=r"^swin_patch_(?:embedding|norm)$",
                              units=((r"^swin_stage(\d+)_block\d+_", 0), (r"^swin_merge(\d+)_", 0)),
                              top=r"^swin_norm$", no_decay=r"_block\d+_(?:scale|position_bias)$"),
}


@dataclass(frozen=True)
class Head:
    # head(feature map, n_tags, seed) -> one logit per tag (models.blocks).
    builder: str
    # Whether its output layer has a bias (head_bias_init log_prior sets it).
    bias: bool


HEADS: dict[str, Head] = {
    # 7x7 valid average pool, flatten, dense, sigmoid (resnet_152).
    "dense": Head("deepdanbooru.models.blocks:dense_head", bias=True),
    # 1x1 conv to n_tags without bias, global average pool, sigmoid.
    "conv": Head("deepdanbooru.models.blocks:conv_head", bias=False),
    # Global average pool, dense to n_tags with bias, sigmoid.
    "pooled": Head("deepdanbooru.models.blocks:pooled_head", bias=True),
}


@dataclass(frozen=True)
class Architecture:
    widths: tuple[int, ...]
    repeats: tuple[int, ...]
    head: str
    family: str = "resnet"
    # convnext, efficientnetv2: the keras.applications function.
    application: str | None = None
    # vit: the input's sides must be multiples of the patch; widths[0] is split across `heads`.
    patch: int = 0
    heads: int = 0
    # efficientnetv2 as keras.applications builds it (width and depth coefficients 1.0): the stem's
    # filters, one (kernel, expand ratio, stride, squeeze-excite ratio, fused) per stage in the order of
    # widths and repeats, and the top conv's filters.
    stem: int = 0
    stages: tuple[tuple[int, int, int, float, bool], ...] = ()
    top: int = 0


MODELS: dict[str, Architecture] = {}


def register_model(name: str, **config) -> Architecture:
    """Add `name` to the registry: its one row, the only place the model is configured."""
    architecture = Architecture(**config)
    if name in MODELS:
        raise ValueError(f"model {name!r} is registered twice")
    if architecture.family not in FAMILIES or architecture.head not in HEADS:
        raise ValueError(f"model {name!r}: unknown family {architecture.family!r} or head {architecture.head!r}")
    MODELS[name] = architecture
    return architecture


def model_names() -> tuple[str, ...]:
    return tuple(MODELS)


def resolve(reference: str):
    """The function a "module:function" reference names, imported now."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


register_model("resnet_152", widths=(256, 512, 1024, 2048), repeats=(2, 7, 35, 2), head="dense")
register_model("resnet_custom_v1", widths=(256, 512, 1024, 2048, 4096), repeats=(2, 7, 35, 2, 2), head="conv")
register_model("resnet_custom_v2", widths=(256, 512, 1024, 1024, 1024, 2048), repeats=(2, 7, 40, 16, 16, 6),
               head="conv")
register_model("resnet_custom_v3", widths=(256, 512, 1024, 1024, 2048, 4096), repeats=(2, 7, 19, 19, 2, 2),
               head="conv")
register_model("resnet_custom_v4", widths=(256, 512, 1024, 1024, 1024, 2048), repeats=(2, 7, 10, 10, 10, 2),
               head="conv")
register_model("resnet_small", widths=(64, 128, 256, 512), repeats=(1, 1, 1, 1), head="conv")
# widths and repeats are the applications' own projection_dims and depths.
register_model("convnext_tiny", widths=(96, 192, 384, 768), repeats=(3, 3, 9, 3), head="pooled",
               family="convnext", application="ConvNeXtTiny")
register_model("convnext_small", widths=(96, 192, 384, 768), repeats=(3, 3, 27, 3), head="pooled",
               family="convnext", application="ConvNeXtSmall")
# widths: each stage's output filters.
_EFFICIENTNETV2_STAGES = ((3, 1, 1, 0.0, True), (3, 4, 2, 0.0, True), (3, 4, 2, 0.0, True),
                          (3, 4, 2, 0.25, False), (3, 6, 1, 0.25, False), (3, 6, 2, 0.25, False))
register_model("efficientnetv2_b0", widths=(16, 32, 48, 96, 112, 192), repeats=(1, 2, 2, 3, 5, 8), head="pooled",
               family="efficientnetv2", application="EfficientNetV2B0", stem=32, stages=_EFFICIENTNETV2_STAGES,
               top=1280)
register_model("efficientnetv2_s", widths=(24, 48, 64, 128, 160, 256), repeats=(2, 4, 4, 6, 9, 15), head="pooled",
               family="efficientnetv2", application="EfficientNetV2S", stem=24, stages=_EFFICIENTNETV2_STAGES,
               top=1280)
# ViT-S/16 (Dosovitskiy et al.; DeiT-S): width 384, 12 blocks, 6 heads, MLP 4x.
register_model("vit_small_patch16", widths=(384,), repeats=(12,), head="pooled", family="vit", patch=16, heads=6)
