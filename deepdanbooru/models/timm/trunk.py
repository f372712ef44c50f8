"""backbone_weights as a timm checkpoint folder: its trunk into a model of the registry, the head fresh.

The same weight tables as import-model fill the registry's layers of the
same name (the importer's builders name their layers after the registry's).
What the registry's trunk has no place for is left out, and what differs is
adapted:
- the checkpoint's mean, std and channel order are folded into the first
  convolution relative to the registry model's own preprocessing layer, so
  the registry model still takes RGB in [0, 1];
- ViT: class and register tokens are dropped (the registry's ViT has none),
  the position table keeps its patch rows, resampled bicubically when the
  project's token grid differs from the checkpoint's; a final norm after
  pooling (fc_norm) fills the registry's norm before pooling;
- ConvNeXt: the head's norm (after pooling, or before it with
  head_norm_first) fills the registry trunk's final norm (before pooling);
- the registry's activation is exact GELU; a gelu_tanh checkpoint loads as
  a start that differs by that approximation (at most about 5e-4 per unit).
The checkpoint's head is ignored.
"""

from __future__ import annotations

import keras
import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import convnext, parts, vit
from deepdanbooru.models.timm.checkpoint import check_tensors, family_of, set_layer_weights
from deepdanbooru.models.timm.safetensors import read_tensors
from deepdanbooru.models.timm.source import read_source
from deepdanbooru.models.table import get_architecture

# Head tensors the trunk ignores, per family.
_HEADS = {vit: ("head.weight", "head.bias"), convnext: ("head.fc.weight", "head.fc.bias")}
_REGISTRY_FAMILY = {vit: "vit", convnext: "convnext"}


def _reference_normalisation(layer) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) that the registry model's preprocessing layer applies to [0, 1] input."""
    if isinstance(layer, keras.layers.Rescaling):
        # x * scale + offset == (x - mean) / std
        scale, offset = float(layer.scale), float(layer.offset)
        return np.full(3, -offset / scale), np.full(3, 1.0 / scale)
    mean = np.reshape(keras.ops.convert_to_numpy(layer.mean), -1)
    variance = np.reshape(keras.ops.convert_to_numpy(layer.variance), -1)
    return mean, np.sqrt(variance)


def _mismatch(source, what: str, name: str, have, need):
    raise ModelError(file_field(source.config_path, None, f"{source.architecture}'s {what} is {have}; {name}'s trunk "
                                                          f"needs {need}"))


def _vit_weights(opts, tensors, model, name, architecture, source):
    expected = (architecture.widths[0], architecture.repeats[0], architecture.heads, architecture.patch)
    have = (opts.width, opts.depth, opts.heads, opts.patch)
    if have != expected or opts.mlp_width != 4 * opts.width:
        _mismatch(source, "(embed_dim, depth, num_heads, patch_size, mlp width)", name,
                  (*have, opts.mlp_width), (*expected, 4 * expected[0]))
    out = vit.trunk_weights(opts, tensors)
    out["vit_norm"] = vit.norm_weights(tensors, "fc_norm" if opts.fc_norm else "norm")
    table = tensors["pos_embed"].reshape(opts.table_length, opts.width)
    patches = table if opts.no_embed_class else table[opts.prefix_tokens:]
    grid = tuple(int(d) for d in model.get_layer("vit_token_grid").output.shape[1:3])
    out["vit_position_embedding"] = [parts.resample_grid(patches, opts.grid, grid).reshape(1, -1)]
    return out, vit.patch_kernel(tensors), "vit_patch_embedding"


def _convnext_weights(opts, tensors, model, name, architecture, source):
    have, need = (opts.dims, opts.depths), (architecture.widths, architecture.repeats)
    if have != need:
        _mismatch(source, "(dims, depths)", name, have, need)
    registry = ((7,) * convnext.STAGES, 4, True, convnext.EPSILON)
    if (opts.kernels, opts.patch, opts.bias, opts.epsilon) != registry:
        _mismatch(source, "(kernel_sizes, patch_size, conv_bias, norm_eps)", name,
                  (opts.kernels, opts.patch, opts.bias, opts.epsilon), registry)
    out = convnext.trunk_weights(opts, tensors, name)
    out[f"{name}_layer_normalization_0"] = convnext._norm_weights(
        tensors, "norm_pre" if opts.head_norm_first else "head.norm")
    return out, convnext.stem_kernel(tensors), f"{name}_stem_conv"


def load_trunk(model: keras.Model, name: str, folder, channel_order: str | None = None) -> int:
    """Fill `model` (build_model(name, ...)) with the trunk of the timm checkpoint in `folder`; returns the
    number of layers loaded. `channel_order` None: bgr with a selected_tags.csv, else rgb (as import-model)."""
    source = read_source(folder, channel_order, need_head=False)
    family = family_of(source)
    architecture = get_architecture(name)
    if family not in _REGISTRY_FAMILY:
        raise ModelError(file_field(source.config_path, "architecture",
                                    f"the {source.architecture} checkpoint has no model in the registry to start "
                                    "(timm ViT and ConvNeXt trunks can; import-model takes it whole)"))
    if architecture.family != _REGISTRY_FAMILY[family]:
        raise ModelError(file_field(source.config_path, "architecture",
                                    f"a {source.architecture} checkpoint cannot start {name} (a {architecture.family} "
                                    f"model); choose a {_REGISTRY_FAMILY[family]} model in project.json"))
    opts = family.options(source.architecture, source.model_args, max(source.num_classes, 1), source.config_path)
    expected = family.expected_tensors(opts, head=False)
    check_tensors(source.weights_path, expected, optional=_HEADS[family])
    tensors = read_tensors(source.weights_path, expected)
    make = _vit_weights if family is vit else _convnext_weights
    weights, (kernel, bias), first = make(opts, tensors, model, name, architecture, source)
    reference_mean, reference_std = _reference_normalisation(model.get_layer("preprocess"))
    weights[first] = list(parts.fold_input(kernel, bias, source.mean, source.std, source.channel_order,
                                           reference_mean, reference_std))
    set_layer_weights(model, weights, source.weights_path)
    return len(weights)
