"""What can be known about a registered model (deepdanbooru.registry) without building it.

STANDARD LIBRARY ONLY: preflight and the CLI use `check_model_input` and
`parameter_counts` to refuse or size a model before TensorFlow is imported.
"""

from __future__ import annotations

import difflib

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.counts import STEM_HALVINGS, final_feature_size
from deepdanbooru.registry import APPLICATION_MINIMUM, FAMILIES, HEADS, MODELS, POOL_SIZE, Architecture, resolve


def model_names() -> tuple[str, ...]:
    return tuple(MODELS)


def get_architecture(name: str, source=None) -> Architecture:
    """The table row for `name`; an unknown name is a ModelError listing the valid ones."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        pass
    close = difflib.get_close_matches(str(name), list(MODELS), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    message = f"unknown model {name!r}{hint}; valid models: {', '.join(MODELS)}"
    raise ModelError(file_field(source, "model", message) if source else message)


def head_has_bias(name: str) -> bool:
    """Whether the model's output layer has a bias (head_bias_init log_prior needs one)."""
    return HEADS[get_architecture(name).head].bias


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
    halvings = STEM_HALVINGS + len(architecture.widths) - 1
    return (POOL_SIZE - 1) * 2**halvings + 1


def _why_too_small(name: str, architecture: Architecture, height: int, width: int) -> str:
    if architecture.application:
        return f"(keras.applications' {architecture.application} takes nothing smaller)"
    final = final_feature_size(architecture, height, width)
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
    """(trainable, non_trainable) of build_model(name, input_shape, n_tags), by the family's counter
    (models.counts), without building."""
    architecture = check_model_input(name, input_shape)
    return resolve(FAMILIES[architecture.family].counter)(name, architecture, tuple(input_shape), n_tags)
