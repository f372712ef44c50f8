"""import_checkpoint: a timm checkpoint folder -> an ordinary Keras model of built-in layers.

Each family module gives: `options(architecture, model_args, num_classes,
config_path)` (refuses what it cannot build), `input_size(options,
pretrained_size, config_path)`, `build(options, name, input_size)`,
`expected_tensors(options)` (the checkpoint's names and shapes) and
`layer_weights(options, tensors, fold, name)` (layer name -> weights: the
table of source tensor -> layer weight with its transform; `name` prefixes
ConvNeXt's layers). The file is checked against the expected names and shapes
before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm import convnext, eva02, parts, swinv2, vit
from deepdanbooru.models.timm.safetensors import read_header, read_tensors
from deepdanbooru.models.timm.source import CheckpointSource, class_names, network_name, read_source

# architecture-name prefix -> family module
FAMILIES = {"vit_": vit, "convnext_": convnext, "swinv2_": swinv2, "eva02_": eva02}
SUPPORTED = ", ".join(family.SUPPORTED for family in FAMILIES.values())


@dataclass(frozen=True)
class ImportedModel:
    model: keras.Model
    tags: tuple[str, ...]
    categories: tuple[int, ...] | None  # WD category ids from selected_tags.csv, else None
    input_size: tuple[int, int]  # (height, width)
    channel_order: str
    channel_order_reason: str
    source: CheckpointSource


def family_of(source: CheckpointSource):
    for prefix, module in FAMILIES.items():
        if source.architecture.startswith(prefix):
            return module
    raise ModelError(file_field(source.config_path, "architecture",
                                f"{source.architecture!r} is not supported; supported: {SUPPORTED}"))


def check_tensors(path, expected: dict, optional=()) -> None:
    """Missing, extra or misshapen tensors: one line naming them."""
    present, _ = read_header(path)
    missing = [name for name in expected if name not in present]
    if missing:
        raise ModelError(file_field(path, None, f"missing {len(missing)} tensor(s) the architecture needs: "
                                                f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"))
    extra = [name for name in present if name not in expected and name not in optional]
    if extra:
        raise ModelError(file_field(path, None, f"{len(extra)} tensor(s) the architecture does not have (is "
                                                f"model_args right?): {', '.join(extra[:8])}"
                                                f"{' ...' if len(extra) > 8 else ''}"))
    for name, shape in expected.items():
        if tuple(present[name].shape) != tuple(shape):
            raise ModelError(file_field(path, name, f"has shape {list(present[name].shape)}, the architecture "
                                                    f"needs {list(shape)}"))


def set_layer_weights(model: keras.Model, weights: dict, source) -> None:
    for name, values in weights.items():
        layer = model.get_layer(name)
        shapes = [tuple(w.shape) for w in layer.weights]
        if shapes != [tuple(np.shape(v)) for v in values]:
            raise ModelError(file_field(source, None, f"layer {name}: weights {[np.shape(v) for v in values]} do "
                                                      f"not fit {shapes}"))
        layer.set_weights([np.asarray(v, dtype=np.float32) for v in values])


def import_checkpoint(folder, channel_order: str | None = None, input_size=None) -> ImportedModel:
    """Build and fill the Keras model for a timm checkpoint folder (config.json + model.safetensors).

    The model takes RGB in [0, 1] at the checkpoint's input size, with the checkpoint's mean, std and
    `channel_order` ("rgb" or "bgr"; None: bgr with selected_tags.csv, else rgb) folded into its first
    convolution, and outputs one sigmoid score per head row. `input_size` (height, width): another size,
    for the families whose weights can be resized to it (ViT: the position table is resampled).
    """
    source = read_source(folder, channel_order)
    family = family_of(source)
    opts = family.options(source.architecture, source.model_args, source.num_classes, source.config_path)
    expected = family.expected_tensors(opts)
    check_tensors(source.weights_path, expected)
    tensors = read_tensors(source.weights_path, expected)
    size = family.input_size(opts, source.input_size, source.config_path)
    if input_size is not None and tuple(input_size) != tuple(size):
        if not hasattr(family, "resized"):
            raise ModelError(file_field(source.config_path, "architecture", (
                f"a {source.architecture} checkpoint takes {size[1]}x{size[0]} only (a ViT's position table can "
                f"be resampled to {input_size[1]}x{input_size[0]}; this family cannot)")))
        opts, tensors = family.resized(opts, tensors, input_size, source.config_path)
        size = tuple(input_size)
    model = family.build(opts, source.architecture, size)

    def fold(kernel, bias):
        return parts.fold_input(kernel, bias, source.mean, source.std, source.channel_order)

    weights = family.layer_weights(opts, tensors, fold, source.architecture)
    unset = [layer.name for layer in model.layers if layer.weights and layer.name not in weights]
    if unset:
        raise ModelError(f"{source.architecture}: no weights mapped for layers {', '.join(unset[:5])}")
    set_layer_weights(model, weights, source.weights_path)
    name = network_name(source, size if input_size is not None else None)
    if name != model.name:
        # The same layers under the network's own name (the architecture's alone names another network).
        # model.input/output, not the lists: a model built on one-element lists warns on every call
        # that the structure of its inputs does not match.
        model = keras.Model(model.input, model.output, name=name)
    return ImportedModel(model, class_names(source), source.categories, size, source.channel_order,
                         source.channel_order_reason, source)
