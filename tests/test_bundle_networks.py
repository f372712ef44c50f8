"""export-bundle's conversion for every network: each model-table row and each imported timm family, run through
onnxruntime as the tools run a bundle and compared with the Keras model.

Tiny inputs (the smallest each network takes) keep the conversions short, yet a ConvNeXt or a ViT row still takes
half a minute or more on a shared 2-core machine: those are marked slow, and the rows that only repeat their
layers (more blocks, more channels) are converted by bench/bundle_networks.py, whose output docs/evaluation.md
records. What made the ConvNeXt and EfficientNetV2 rows fail, a constant captured outside the model's variables,
has a fast test of its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepdanbooru.inference.convert import FLOAT_TOLERANCE, onnx_available

needs_onnx = pytest.mark.skipif(not onnx_available(), reason="needs tf2onnx and onnxruntime")

TIMM = Path(__file__).parent / "fixtures" / "timm"
# The rows mapped as a bundle maps them: reordered, with a constant rating row reading no output.
SOURCES = [2, None, 0, 4, 1, 3]
FAST_ROWS = ("resnet_small",)
SLOW_ROWS = ("convnext_tiny", "efficientnetv2_b0", "vit_small_patch16")
# Same layers as a row above, only more of them: bench/bundle_networks.py.
BENCH_ROWS = ("resnet_custom_v1", "resnet_custom_v2", "resnet_custom_v3", "resnet_custom_v4", "convnext_small",
              "efficientnetv2_s", "resnet_152")
FAMILIES = ("vit_wd", "convnext_wd", "eva02_wd")
SLOW_FAMILIES = ("swinv2_wd",)


def _converted(model, size):
    from deepdanbooru.inference.bundle import convert_for_tools
    from deepdanbooru.inference.convert import run_onnx, sample_inputs

    content, _, difference, samples, _ = convert_for_tools(model, SOURCES, size, FLOAT_TOLERANCE,
                                                            Path("model.onnx"))
    # What a tool gets back: the graph has one input, the picture, and answers one row per selected_tags.csv row.
    import onnxruntime

    session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
    assert [item.name for item in session.get_inputs()] == ["input"]
    scores = run_onnx(content, sample_inputs(size, size)[:2] * 255.0)
    assert scores.shape == (2, len(SOURCES)) and np.all(scores[:, 1] == 0.0)
    return difference, samples


def _row(name):
    from deepdanbooru.models import build_model, minimum_input_size

    size = max(32, minimum_input_size(name))
    return build_model(name, (size, size, 3), 5, seed=1), size


def test_every_model_row_is_covered():
    from deepdanbooru.models import model_names

    assert set(FAST_ROWS) | set(SLOW_ROWS) | set(BENCH_ROWS) == set(model_names())


@needs_onnx
def test_a_constant_outside_the_variables_is_part_of_the_graph_not_an_input():
    # Keras' ConvNeXt and EfficientNetV2 normalise their input with a Normalization layer given its mean and
    # variance: constants, not variables, which a traced function captures as extra inputs.
    import keras

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Normalization(mean=[0.4, 0.5, 0.6], variance=[0.05, 0.06, 0.07])(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(5, activation="sigmoid")(x)
    difference, samples = _converted(keras.Model(inputs, outputs), 8)
    assert samples == 8 and difference <= FLOAT_TOLERANCE


@needs_onnx
@pytest.mark.parametrize("name", [*FAST_ROWS, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW_ROWS)])
def test_model_row_converts_for_the_tools(name):
    model, size = _row(name)
    difference, samples = _converted(model, size)
    assert samples == 8 and difference <= FLOAT_TOLERANCE


@needs_onnx
@pytest.mark.parametrize("family", [*FAMILIES, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW_FAMILIES)])
def test_imported_family_converts_for_the_tools(family):
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    imported = import_checkpoint(TIMM / family)
    model = imported.model
    model_outputs = int(model.output_shape[-1])
    assert model_outputs >= 5
    difference, _ = _converted(model, int(model.input_shape[1]))
    assert difference <= FLOAT_TOLERANCE
