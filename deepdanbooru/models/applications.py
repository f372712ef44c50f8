"""keras.applications trunks (ConvNeXt, EfficientNetV2) rebuilt from built-in layers.

The application is built once per process with weights=None and
include_top=False (nothing is downloaded), and its functional config is
replayed layer by layer onto our input:

- its preprocessing is replaced by one layer that expects our pipeline's RGB
  in [0, 1] and computes the same values the application's own
  preprocessing computes from [0, 255];
- nested Sequential blocks (ConvNeXt's stem and downsampling) are inlined,
  so every layer is a layer of the tagger (grad-cam, mixed-precision
  rebuilds and name lookups see one flat graph);
- ConvNeXt's LayerScale, a private Keras class, becomes a bias-free 1x1
  DepthwiseConv2D initialised to the same constant (the same per-channel
  scale), and its `x + y` op nodes become Add layers, so exports hold only
  built-in layers; its depthwise convolutions, grouped Conv2D layers there,
  are DepthwiseConv2D layers (the same weights; ONNX conversion needs it);
- EfficientNetV2's stochastic depth (Dropout on residual branches) is left
  out: its random state would have to be checkpointed and mirrored to keep
  kill-and-resume exact, and ConvNeXt's default drop rate is 0 anyway;
- every initializer gets a seed derived from (model seed, layer name), and
  auto-generated names (which depend on what the process built before) are
  replaced by names derived from the model's, so a build is a pure function
  of (name, input shape, seed).

`reference_trunk` is the application itself, used to read weight files
written for it (models.backbone).
"""

from __future__ import annotations

import copy
import functools
import re

import keras
from keras import layers

from deepdanbooru.compat import is_op_node
from deepdanbooru.models.blocks import layer_seed
from deepdanbooru.models.table import get_architecture
from deepdanbooru.registry import APPLICATION_MINIMUM

_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_VARIANCE = [0.229**2, 0.224**2, 0.225**2]


def _preprocessing(application: str) -> layers.Layer:
    """The application's include_preprocessing, folded for [0, 1] input."""
    if application == "EfficientNetV2S":
        # Rescaling(1/128, offset=-1) of [0, 255] values.
        return layers.Rescaling(255.0 / 128.0, offset=-1.0, name="preprocess")
    # ConvNeXt and EfficientNetV2-B*: ImageNet mean and standard deviation of values in [0, 1].
    return layers.Normalization(mean=_IMAGENET_MEAN, variance=_IMAGENET_VARIANCE, name="preprocess")


def reference_trunk(name: str, input_shape=None) -> keras.Model:
    """The keras.applications model itself: include_top=False, no weights, its own preprocessing off."""
    application = get_architecture(name).application
    shape = tuple(input_shape) if input_shape else (APPLICATION_MINIMUM, APPLICATION_MINIMUM, 3)
    return getattr(keras.applications, application)(
        include_top=False, weights=None, input_shape=shape, include_preprocessing=False)


@functools.lru_cache(maxsize=None)
def _layer_entries(name: str) -> tuple:
    # Layer configs hold no spatial sizes, so one small build serves every input size.
    config = reference_trunk(name).get_config()
    output = config["output_layers"]
    # One output is written as [name, node, tensor], several as a list of those.
    output_name = output[0] if isinstance(output[0], str) else output[0][0]
    return tuple(config["layers"]), output_name


def _snake(class_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()


def _is_auto_name(entry: dict) -> bool:
    return re.fullmatch(re.escape(_snake(entry["class_name"])) + r"(_\d+)?", entry["name"]) is not None


class _Replay:
    def __init__(self, model_name: str, seed: int):
        self.model_name = model_name
        self.seed = seed
        self.tensors: dict[str, object] = {}
        self.auto_counts: dict[str, int] = {}

    def stable_name(self, entry: dict) -> str:
        if not _is_auto_name(entry):
            return entry["name"]
        kind = _snake(entry["class_name"])
        index = self.auto_counts.get(kind, 0)
        self.auto_counts[kind] = index + 1
        return f"{self.model_name}_{kind}_{index}"

    def make(self, entry: dict, name: str) -> layers.Layer:
        config = copy.deepcopy(entry["config"])
        config["name"] = name
        # Under the caller's global policy (mixed precision), like the ResNets.
        config.pop("dtype", None)
        for key, value in config.items():
            if key.endswith("_initializer") and isinstance(value, dict) and "seed" in value.get("config", {}):
                value["config"]["seed"] = layer_seed(self.seed, f"{name}/{key}")
        if entry["class_name"] == "Conv2D" and config["groups"] > 1 and config["groups"] == config["filters"]:
            # ConvNeXt's depthwise conv, written as a grouped Conv2D: Keras runs grouped convs on a CPU
            # through XLA, which tf2onnx cannot convert. The same weights as (k, k, C, 1) instead of
            # (k, k, 1, C), in the same memory order, and the same Glorot fans.
            return layers.DepthwiseConv2D(
                config["kernel_size"], strides=config["strides"], padding=config["padding"],
                use_bias=config["use_bias"], name=name, depthwise_initializer=config["kernel_initializer"],
                bias_initializer=config["bias_initializer"])
        if entry["class_name"] == "LayerScale":
            return layers.DepthwiseConv2D(
                1, use_bias=False, name=name,
                depthwise_initializer=keras.initializers.Constant(config["init_values"]))
        return layers.deserialize({"module": entry["module"], "class_name": entry["class_name"],
                                   "config": config, "registered_name": entry.get("registered_name")})

    def resolve(self, value):
        if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
            return self.tensors[value["config"]["keras_history"][0]]
        if isinstance(value, (list, tuple)):
            return [self.resolve(item) for item in value]
        return value

    def inputs_of(self, entry: dict) -> list:
        nodes = entry["inbound_nodes"]
        if len(nodes) != 1 or any(value is not None for value in nodes[0]["kwargs"].values()):
            raise ValueError(f"layer {entry['name']!r} of {self.model_name} is called in a way this "
                             "replay does not know; update deepdanbooru.models.applications")
        return self.resolve(nodes[0]["args"])

    def run(self, entry: dict) -> None:
        kind = entry["class_name"]
        if kind == "InputLayer":
            return
        if kind == "Dropout":
            self.tensors[entry["name"]] = self.resolve(entry["inbound_nodes"][0]["args"])[0]
            return
        args = self.inputs_of(entry)
        if kind == "Sequential":
            x = args[0]
            for inner in entry["config"]["layers"]:
                if inner["class_name"] != "InputLayer":
                    x = self.make(inner, inner["config"]["name"])(x)
            self.tensors[entry["name"]] = x
        elif is_op_node(entry) and kind == "Add":
            self.tensors[entry["name"]] = layers.Add(name=self.stable_name(entry))(args)
        elif is_op_node(entry):
            raise ValueError(f"{self.model_name}: op node {kind!r} has no built-in layer here; update "
                             "deepdanbooru.models.applications")
        else:
            self.tensors[entry["name"]] = self.make(entry, self.stable_name(entry))(*args)


def trunk(name: str, image, seed: int):
    """The application's feature map for `image` (an [0, 1] RGB input tensor)."""
    architecture = get_architecture(name)
    entries, output_name = _layer_entries(name)
    replay = _Replay(name, seed)
    input_name = next(entry["name"] for entry in entries if entry["class_name"] == "InputLayer")
    replay.tensors[input_name] = _preprocessing(architecture.application)(image)
    for entry in entries:
        replay.run(entry)
    return replay.tensors[output_name]
