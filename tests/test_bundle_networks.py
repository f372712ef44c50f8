"""export-bundle's conversion for every network: each model-table row and each imported timm family, run through
onnxruntime as the tools run a bundle and compared with the Keras model.

Tiny inputs (the smallest each network takes) keep the conversions short; the rows beyond resnet_small still take
10-30 s each on a shared 2-core machine, so they are marked slow. What made the ConvNeXt and EfficientNetV2 rows
fail, a constant captured outside the model's variables, and what made the largest ResNets run out of memory,
weights converted as constants, each have a fast test of their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepdanbooru.inference.convert import FLOAT_TOLERANCE
from deepdanbooru.inference.onnx_graph import onnx_available

needs_onnx = pytest.mark.skipif(not onnx_available(), reason="needs tf2onnx and onnxruntime")

TIMM = Path(__file__).parent / "fixtures" / "timm"
# The rows mapped as a bundle maps them: reordered, with a constant rating row reading no output.
SOURCES = [2, None, 0, 4, 1, 3]
FAST_ROWS = ("resnet_small",)
SLOW_ROWS = ("convnext_tiny", "efficientnetv2_b0", "vit_small_patch16", "resnet_custom_v1", "resnet_custom_v2",
             "resnet_custom_v3", "resnet_custom_v4", "convnext_small", "efficientnetv2_s", "resnet_152")
FAMILIES = ("vit_wd", "convnext_wd", "eva02_wd")
SLOW_FAMILIES = ("swinv2_wd",)


def _converted(model, size):
    from deepdanbooru.inference.bundle import convert_for_tools
    from deepdanbooru.inference.convert import sample_inputs
    from deepdanbooru.inference.onnx_graph import run_onnx

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

    assert set(FAST_ROWS) | set(SLOW_ROWS) == set(model_names())


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


@needs_onnx
def test_the_weights_reach_the_converter_as_inputs_and_the_file_as_folded_initializers(monkeypatch):
    # tf2onnx rewrites each node's protobuf after every optimizer pass and the old bytes of a constant stay
    # allocated, so a graph converted with its weights as constants grew by a copy of them per pass (resnet_152
    # past 13 GB). The converter must be handed a graph whose weights are inputs...
    import onnx
    import tf2onnx

    from deepdanbooru.models import build_model

    model = build_model("resnet_small", (32, 32, 3), 5, seed=1)
    seen = {}
    convert = tf2onnx.convert.from_function

    def watched(function, input_signature, **kwargs):
        graph = function.get_concrete_function(*input_signature).graph
        seen["largest_constant"] = max(
            (int(np.prod(op.outputs[0].shape)) for op in graph.get_operations() if op.type == "Const"), default=0)
        seen["inputs"] = len(input_signature)
        return convert(function, input_signature=input_signature, **kwargs)

    monkeypatch.setattr(tf2onnx.convert, "from_function", watched)
    from deepdanbooru.inference.bundle import convert_for_tools

    content, _, difference, _, _ = convert_for_tools(model, SOURCES, 32, FLOAT_TOLERANCE, Path("model.onnx"))
    assert difference <= FLOAT_TOLERANCE
    # ... the picture plus every variable, and no constant of a layer's size inside.
    assert seen["inputs"] == 1 + len(model.variables)
    assert seen["largest_constant"] < min(int(np.prod(v.shape)) for v in model.variables if len(v.shape) == 4)
    # ...and the file holds them folded: BatchNormalization gone into the convolutions, no transpose of a weight.
    graph = onnx.load_model_from_string(content).graph
    kinds = [node.op_type for node in graph.node]
    convolutions = sum(1 for layer in model.layers if type(layer).__name__ == "Conv2D")
    assert kinds.count("Conv") == convolutions
    assert not {"BatchNormalization", "Sqrt", "Reciprocal"} & set(kinds)
    assert kinds.count("Transpose") <= 2
    assert [item.name for item in graph.input] == ["input"]
    assert {entry.domain for entry in onnx.load_model_from_string(content).opset_import} <= {"", "ai.onnx"}
