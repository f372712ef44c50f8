"""A Keras model, alone or inside pre- and post-processing, as an ONNX graph (tf2onnx, then onnxruntime).

tf2onnx rewrites every node's protobuf after each of its optimizer passes, and with protobuf's arena-based
runtime a rewritten constant's old bytes stay allocated until the whole node goes: a model converted with its
weights as constants grew by about one copy of the weights per pass (resnet_152, 233 MB of weights: past 13 GB
and still growing; the larger rows of the model table the same way). So the weights are traced as inputs of the
graph (the model run through `stateless_call`), tf2onnx converts a graph that holds no large constant, and each
weight input becomes an initializer afterwards. onnxruntime's basic graph optimizations, the level whose
output any ONNX runtime can run (constant folding, BatchNorm folded into the convolution before it), then fold
the weight transposes and normalizations the constant weights used to let tf2onnx fold itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from deepdanbooru.errors import ModelError
from deepdanbooru.tfimport import quiet_stdout

ONNX_OPSET = 17
# The domain of the standard operators; a node of any other domain would tie the file to one runtime.
STANDARD_DOMAINS = ("", "ai.onnx")


def onnx_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
        import tf2onnx  # noqa: F401
    except ImportError:
        return False
    return True


def require_onnx(what: str = "--format onnx") -> None:
    if not onnx_available():
        raise ModelError(f"{what} needs the optional packages tf2onnx and onnxruntime: "
                         "pip install 'deepdanbooru[onnx]'")


def to_onnx(model) -> bytes:
    """The model alone: one float32 NHWC input named "image", its outputs named as the Keras model names them
    (what tf2onnx's Keras converter named them)."""
    import tensorflow as tf

    height, width, channels = model.input_shape[1:]
    signature = (tf.TensorSpec((None, height, width, channels), tf.float32, name="image"),)
    return model_graph_to_onnx(model, lambda run, image: run(image), signature,
                               output_names=list(getattr(model, "output_names", None) or ()))


def model_graph_to_onnx(model, body, signature, output_names=None) -> bytes:
    """ONNX bytes of `body(run, *inputs)`, where `run(x)` is the model in inference mode and `signature` the
    TensorSpecs of the inputs; the graph's outputs are renamed to `output_names` where given."""
    require_onnx()
    import tensorflow as tf
    import tf2onnx

    trainable, other = list(model.trainable_variables), list(model.non_trainable_variables)
    variables = trainable + other
    count = len(signature)

    def traced(*arguments):
        weights = arguments[count:]

        def run(images):
            scores, _ = model.stateless_call(list(weights[:len(trainable)]), list(weights[len(trainable):]),
                                             images, training=False)
            return scores

        return body(run, *arguments[:count])

    weight_specs = tuple(tf.TensorSpec(tuple(variable.shape), variable.dtype, name=f"weight_{index}")
                         for index, variable in enumerate(variables))
    full_signature = tuple(signature) + weight_specs
    function = tf.function(traced, input_signature=full_signature, autograph=False)
    with quiet_stdout():
        proto, _ = tf2onnx.convert.from_function(function, input_signature=full_signature, opset=ONNX_OPSET,
                                                 custom_op_handlers=_onnx_handlers())
    values = {spec.name: np.asarray(variable) for spec, variable in zip(weight_specs, variables)}
    concrete = function.get_concrete_function(*full_signature)
    values.update(_captured_constants(concrete))
    _inputs_as_initializers(proto, values)
    # tf2onnx names outputs after graph tensors ("Identity:0"); some consumers look them up by name.
    for output, name in zip(proto.graph.output, output_names or ()):
        for node in proto.graph.node:
            node.output[:] = [name if value == output.name else value for value in node.output]
        output.name = name
    return folded(proto.SerializeToString())


def _captured_constants(concrete) -> dict:
    """Constant tensors a model holds outside its variables (the mean and variance of the preprocessing layer of
    Keras' ConvNeXt and EfficientNetV2) are captured by a traced function, and tf2onnx keeps them as graph
    inputs that a runtime would then ask to be fed: their values, by the name of the input."""
    import tensorflow as tf

    return {internal.name: np.asarray(external) for external, internal in concrete.graph.captures
            if internal.dtype != tf.resource}


def _inputs_as_initializers(proto, values: dict) -> None:
    """Each graph input named in `values` (with or without TensorFlow's ":0") becomes an initializer holding its
    value, so the graph keeps only the inputs a caller feeds."""
    from onnx import numpy_helper

    by_name = dict(values)
    by_name.update({name.split(":")[0]: value for name, value in values.items()})
    kept = []
    for graph_input in proto.graph.input:
        value = by_name.get(graph_input.name)
        if value is None:
            kept.append(graph_input)
            continue
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), graph_input.name))
    if len(kept) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(kept)


def folded(content: bytes) -> bytes:
    """The graph after onnxruntime's basic optimizations, the portable level, with the operator sets no node
    uses left out; the graph as given if any node came out in a runtime's own domain."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory(prefix="deepdanbooru-onnx-") as folder:
        options.optimized_model_filepath = str(Path(folder) / "folded.onnx")
        onnxruntime.InferenceSession(content, options, providers=["CPUExecutionProvider"])
        proto = onnx.load(options.optimized_model_filepath)
    used = {node.domain for node in proto.graph.node}
    if not used <= set(STANDARD_DOMAINS):
        return content
    kept = [entry for entry in proto.opset_import if entry.domain in STANDARD_DOMAINS]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)
    return proto.SerializeToString()


def _erfc_as_one_minus_erf(ctx, node, name, args):
    """TensorFlow's exact GELU (ConvNeXt, ViT) computes erfc, which ONNX lacks; erfc(x) = 1 - erf(x)."""
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=dtype))
    erf = ctx.make_node("Erf", [node.input[0]])
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def _onnx_handlers() -> dict:
    return {"Erfc": (_erfc_as_one_minus_erf, ())}


def run_onnx(content: bytes, images: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(content, providers=["CPUExecutionProvider"])
    return np.array(session.run(None, {session.get_inputs()[0].name: images})[0], dtype=np.float32)
