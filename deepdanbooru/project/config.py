"""project.json: defaults, parsing and validation into one frozen ProjectConfig.

Nothing downstream reads raw JSON or re-checks values: they take a ProjectConfig.
"""

from __future__ import annotations

import difflib
import json
import math
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from deepdanbooru.errors import ConfigError, file_field, json_error_text
from deepdanbooru.formats import DEEPDANBOORU_EXTENSIONS, IMAGE_EXTENSIONS
from deepdanbooru.project.recipes import RECIPES
from deepdanbooru.registry import model_names

PROJECT_FILE = "project.json"

MODEL_NAMES = model_names()
LOSS_NAMES = ("binary_crossentropy", "focal_loss", "asymmetric")
OPTIMIZER_NAMES = ("adam", "sgd", "rmsprop", "adamw", "lamb")
LR_SCHEDULES = ("steps", "warmup_cosine")
# epoch_count "fit": train-project plans the epochs that fit its --time-limit (training/fit.py).
FIT = "fit"
JIT_AUTO = "auto"  # jit_compile: XLA where it measured faster (compiling.xla_pays)
HEAD_BIAS_INITS = ("zeros", "log_prior")
TAG_LOSS_WEIGHTS = ("log_frequency",)
DECAY_TOWARD = ("zero", "start")
# adamw and lamb decay by this much when weight_decay is null (timm's and ConvNeXt's usual AdamW value).
DEFAULT_WEIGHT_DECAY = 0.05
BEST_MODEL_METRICS = ("macro_f1", "micro_f1", "map", "mcc", "loss")
# pipeline.fill: what surrounds a picture that does not fill the square, and what becomes of transparency.
PADDING_MODES = ("border", "white")
ALPHA_MODES = ("drop", "white")

# Pillow's own decompression-bomb limit: about a 9,500 x 9,500 image.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


class _Invalid(Exception):
    """A value failed a check; the loader adds the file and key."""


# --- value checkers: each takes the raw JSON value and returns the typed one ---


def _int(minimum: int | None = None, maximum: int | None = None) -> Callable[[Any], int]:
    def check(value):
        # bool is a subclass of int in Python, but `true` is not a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"must be an integer, got {_show(value)}")
        if minimum is not None and value < minimum:
            raise _Invalid(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise _Invalid(f"must be <= {maximum}, got {value}")
        return value

    return check


def _float(
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    exclusive_maximum: bool = False,
) -> Callable[[Any], float]:
    def check(value):
        number = _number(value)
        if minimum is not None:
            if exclusive_minimum and number <= minimum:
                raise _Invalid(f"must be > {minimum}, got {_show(value)}")
            if not exclusive_minimum and number < minimum:
                raise _Invalid(f"must be >= {minimum}, got {_show(value)}")
        if maximum is not None and (number >= maximum if exclusive_maximum else number > maximum):
            raise _Invalid(f"must be {'<' if exclusive_maximum else '<='} {maximum}, got {_show(value)}")
        return number

    return check


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"must be a number, got {_show(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise _Invalid(f"must be a finite number, got {_show(value)}")
    return number


def _epoch_count(value) -> int | str:
    if value == FIT or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    hint = _did_you_mean(value, (FIT,)) if isinstance(value, str) else ""
    raise _Invalid(f'must be an integer >= 1 or "{FIT}", got {_show(value)}{hint}')


def _bool(value) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {_show(value)}")
    return value


def _jit_compile(value) -> bool | str:
    if isinstance(value, bool) or value == JIT_AUTO:
        return value
    hint = _did_you_mean(value, (JIT_AUTO,)) if isinstance(value, str) else ""
    raise _Invalid(f'must be true, false or "{JIT_AUTO}", got {_show(value)}{hint}')


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value):
        if not isinstance(value, str):
            raise _Invalid(f"must be a string, got {_show(value)}")
        if value not in options:
            hint = _did_you_mean(value, options)
            raise _Invalid(f"must be one of {', '.join(options)}, got {_show(value)}{hint}")
        return value

    return check


def _optional_path(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Invalid(f"must be a string path or null, got {_show(value)}")
    if not value.strip():
        raise _Invalid("must not be an empty string (use null for none)")
    return value


def _or_null(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`inner`'s check, with null allowed (and kept as None)."""

    def check(value):
        return None if value is None else inner(value)

    return check


def _optional_float(**limits) -> Callable[[Any], float | None]:
    return _or_null(_float(**limits))


def _mixing_weights(value) -> tuple[float, ...] | None:
    """null, or a non-empty list of numbers in [0, 1] (kept sorted, without repeats)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise _Invalid(f"must be a non-empty list of numbers from 0 to 1, or null, got {_show(value)}")
    weights = [_number(item) for item in value]
    if any(not 0.0 <= weight <= 1.0 for weight in weights):
        raise _Invalid(f"every number must be from 0 to 1, got {_show(value)}")
    return tuple(sorted(set(weights)))


def split_address(text: str) -> tuple[str, int]:
    """HOST:PORT (grpc:// allowed, as TensorFlow writes it) -> (host, port); ValueError saying why otherwise."""
    host, sep, port = text.removeprefix("grpc://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be HOST:PORT of a data-service dispatcher, got {_show(text)}")
    return host, int(port)


def _optional_address(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Invalid(f"must be a HOST:PORT string or null, got {_show(value)}")
    try:
        split_address(value)
    except ValueError as error:
        raise _Invalid(str(error)) from None
    return value


def _optional_choice(options: tuple[str, ...]) -> Callable[[Any], str | None]:
    return _or_null(_choice(options))


def _range(positive: bool = False, maximum: float | None = None) -> Callable[[Any], tuple[float, float] | None]:
    """[lo, hi] with lo <= hi; null or [] disables."""

    def check(value):
        if value is None:
            return None
        if not isinstance(value, list):
            raise _Invalid(f"must be a [low, high] list or null, got {_show(value)}")
        if not value:
            return None
        if len(value) != 2:
            raise _Invalid(f"must have exactly 2 numbers [low, high], got {len(value)}")
        low, high = (_number(v) for v in value)
        if low > high:
            raise _Invalid(f"low must be <= high, got {_show(value)}")
        if positive and low <= 0:
            raise _Invalid(f"low must be > 0, got {_show(value)}")
        if maximum is not None and high > maximum:
            raise _Invalid(f"high must be <= {maximum:g}, got {_show(value)}")
        return (low, high)

    return check


def _extensions(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _Invalid(f"must be a non-empty list of extensions, got {_show(value)}")
    result = []
    for item in value:
        if not isinstance(item, str) or item.lower().lstrip(".") not in IMAGE_EXTENSIONS:
            raise _Invalid(f"entries must be among {', '.join(IMAGE_EXTENSIONS)}, got {_show(item)}")
        extension = item.lower().lstrip(".")
        if extension not in result:
            result.append(extension)
    return tuple(result)


@dataclass(frozen=True)
class LearningRateStep:
    used_epoch: int | None  # None: the entry gives used_fraction
    learning_rate: float
    used_fraction: float | None = None  # in (0, 1): a share of the run's epochs

    def first_epoch(self, epoch_count: float) -> float:
        """The first used_epoch the entry applies to: used_epoch, or ceil(used_fraction x epoch_count), the
        first epoch that starts with at least that share of the epochs done (math.inf: not placed yet)."""
        if self.used_fraction is None:
            return self.used_epoch
        if math.isinf(epoch_count):
            return math.inf
        # The tolerance keeps a share written as epoch / count on that epoch: 0.675 x 40 is epoch 27.
        return math.ceil(self.used_fraction * epoch_count - FRACTION_TOLERANCE)


# How far below a whole epoch used_fraction x epoch_count may fall from float rounding and still be it.
FRACTION_TOLERANCE = 1e-9
STEP_KEYS = ("used_epoch", "used_fraction", "learning_rate")


def _schedule(value) -> tuple[LearningRateStep, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Invalid(f"must be a list of {{used_epoch or used_fraction, learning_rate}} objects, got {_show(value)}")
    return tuple(_schedule_step(f"entry {index}", entry) for index, entry in enumerate(value))


def _schedule_step(where: str, entry) -> LearningRateStep:
    if not isinstance(entry, dict):
        raise _Invalid(f"{where} must be an object with used_epoch (or used_fraction) and learning_rate, got "
                       f"{_show(entry)}")
    extra = set(entry) - set(STEP_KEYS)
    if extra:
        raise _Invalid(f"{where} has unknown key(s) {', '.join(sorted(extra))}")
    given = [name for name in ("used_epoch", "used_fraction") if name in entry]
    if len(given) != 1:
        raise _Invalid(f"{where} {'gives both' if given else 'is missing'} used_epoch and used_fraction; give "
                       "exactly one (used_epoch: a fixed epoch; used_fraction: a share of epoch_count)")
    if "learning_rate" not in entry:
        raise _Invalid(f"{where} is missing learning_rate")
    check = _int(0) if given[0] == "used_epoch" else _float(0.0, 1.0, exclusive_minimum=True, exclusive_maximum=True)
    try:
        when = check(entry[given[0]])
    except _Invalid as error:
        raise _Invalid(f"{where}: {given[0]} {error}") from None
    try:
        rate = _float(0.0, exclusive_minimum=True)(entry["learning_rate"])
    except _Invalid as error:
        raise _Invalid(f"{where}: learning_rate {error}") from None
    if given[0] == "used_epoch":
        return LearningRateStep(when, rate)
    return LearningRateStep(None, rate, when)


def _show(value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


# difflib ratio from which an unknown key counts as a misspelling of a known one (an error) rather
# than an unrelated key (a warning): 'minibatch_sise', 'modle', 'learning_rate_' all pass it.
MISSPELT_CUTOFF = 0.8


# What other training tools call a setting that project.json spells otherwise. Such a key is not a
# typo difflib would catch ('epochs' is closest to warmup_epochs), yet just as silently ignored.
OTHER_TOOLS_KEYS = {
    "epochs": ("epoch_count",), "num_epochs": ("epoch_count",), "max_epochs": ("epoch_count",),
    "max_train_epochs": ("epoch_count",),
    "lr": ("learning_rate",), "base_lr": ("learning_rate",),
    "batch_size": ("minibatch_size",), "train_batch_size": ("minibatch_size",),
    "image_size": ("image_width", "image_height"), "img_size": ("image_width", "image_height"),
    "input_size": ("image_width", "image_height"), "resolution": ("image_width", "image_height"),
    "arch": ("model",), "architecture": ("model",), "backbone": ("model",),
    "database": ("database_path",), "db_path": ("database_path",),
}


def _meant_keys(name: str) -> tuple[str, ...]:
    """The keys an unknown key stands for: another tool's name for them, or a misspelling of one."""
    if name.lower() in OTHER_TOOLS_KEYS:
        return OTHER_TOOLS_KEYS[name.lower()]
    return tuple(difflib.get_close_matches(name, list(KEY_BY_NAME), n=1, cutoff=MISSPELT_CUTOFF))


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --- the key table: DeepDanbooru 1.0's keys first, in its order, then ours ---


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    check: Callable[[Any], Any]
    meaning: str
    type_name: str
    valid: str = ""
    spec: bool = True  # a DeepDanbooru 1.0 key: create-project writes these first, in this order


# Far past any tagger's input (DeepDanbooru 299-512, WD 448); larger sides overflowed the pipeline's size
# arithmetic or crashed the process instead of being refused here.
MAX_IMAGE_SIDE = 8192

KEYS: tuple[Key, ...] = (
    Key("image_width", 299, _int(1, MAX_IMAGE_SIDE), "model input width", "int", f"1 to {MAX_IMAGE_SIDE}"),
    Key("image_height", 299, _int(1, MAX_IMAGE_SIDE), "model input height; input shape is (height, width, 3)", "int",
        f"1 to {MAX_IMAGE_SIDE}"),
    Key("database_path", None, _optional_path,
        "SQLite path; a relative path is resolved against the project directory", "str or null", "must exist to train"),
    Key("minimum_tag_count", 20, _int(0), "eligibility threshold on tag_count_general", "int", ">= 0"),
    Key("model", "resnet_custom_v2", _choice(MODEL_NAMES), "architecture", "str", ", ".join(MODEL_NAMES)),
    Key("minibatch_size", 32, _int(1), "global batch size", "int", "> 0"),
    Key("epoch_count", 10, _epoch_count,
        f'epochs to train; "{FIT}": train-project times its first two slices and plans the epochs '
        "that fit its --time-limit, the learning-rate schedule stretched over them (again at each resume, from "
        "the time left)", f'int or "{FIT}"', f'> 0, or "{FIT}" with --time-limit'),
    Key("export_model_per_epoch", 10, _int(0),
        "0: export after every epoch; N: after each completed epoch e with e % N == 0", "int", ">= 0"),
    Key("checkpoint_frequency_mb", 200, _int(1),
        "slice length in minibatches; a checkpoint is written after every slice", "int", "> 0"),
    Key("console_logging_frequency_mb", 10, _int(1), "log a progress line every N minibatches", "int", "> 0"),
    Key("loss", "binary_crossentropy", _choice(LOSS_NAMES), "loss", "str", ", ".join(LOSS_NAMES)),
    Key("optimizer", "adam", _choice(OPTIMIZER_NAMES),
        "optimizer; sgd means momentum 0.9 with Nesterov", "str", ", ".join(OPTIMIZER_NAMES)),
    Key("learning_rate", 0.001, _float(0.0, exclusive_minimum=True), "base learning rate", "float", "> 0"),
    Key("learning_rates", None, _schedule,
        "at the start of epoch e the rate is that of the last entry, in list order, whose used_epoch <= e; "
        "none matching: learning_rate. An entry with used_fraction f instead applies from epoch "
        f'ceil(f x epoch_count) (with "{FIT}": the planned count, placed again at each plan; a used_epoch other '
        "than 0 is refused there)",
        "list or absent",
        "entries {used_epoch: int >= 0 or used_fraction: 0 < float < 1, learning_rate: float > 0}"),
    Key("rotation_range", (0.0, 360.0), _range(), "rotation in degrees; null or [] disables", "[lo, hi] or null", "lo <= hi"),
    Key("scale_range", (0.9, 1.1), _range(positive=True), "scale factor; null or [] disables", "[lo, hi] or null", "0 < lo <= hi"),
    Key("shift_range", (-0.1, 0.1), _range(), "shift as a fraction of the target size; null or [] disables",
        "[lo, hi] or null", "lo <= hi"),
    Key("mixed_precision", False, _bool, "mixed_float16 compute, loss scaling, float32 output", "bool", "true, false"),
    # Ours. Every default keeps a DeepDanbooru 1.0 project training as it did.
    Key("seed", 0, _int(0), "seed of initial weights, shuffling and augmentation", "int", ">= 0", spec=False),
    Key("image_extensions", DEEPDANBOORU_EXTENSIONS, _extensions,
        "file_ext values eligible for training", "list of str", ", ".join(IMAGE_EXTENSIONS), spec=False),
    Key("max_bad_image_fraction", 0.01, _float(0.0, 1.0),
        "training stops when the fraction of unreadable images seen in an epoch passes this", "float", "0 to 1",
        spec=False),
    Key("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS, _int(1),
        "an image whose header declares more pixels is a bad image and is never decoded", "int", "> 0", spec=False),
    Key("validation_fraction", 0.0, _float(0.0, 0.5),
        "share of eligible records held out for validation, chosen from the post id", "float", "0 to 0.5",
        spec=False),
    Key("validation_frequency_slices", 5, _int(0),
        "validate after every N slices (0: only at epoch ends)", "int", ">= 0", spec=False),
    Key("validation_threshold", 0.5, _float(0.0, 1.0), "working threshold for validation metrics", "float",
        "0 to 1", spec=False),
    Key("best_model_metric", "macro_f1", _choice(BEST_MODEL_METRICS),
        "validation metric that picks model-<model>.best.keras (loss: lower is better)", "str",
        ", ".join(BEST_MODEL_METRICS), spec=False),
    Key("gradient_clip_norm", None, _optional_float(minimum=0.0, exclusive_minimum=True),
        "clip gradients to this global norm (null: off)", "float or null", "> 0", spec=False),
    Key("jit_compile", JIT_AUTO, _jit_compile,
        "run the training step and validation's forward pass under XLA where they compile (one notice names "
        "the reason where one does not, and it runs uncompiled); \"auto\": under XLA when every convolution of "
        "the network is a patch embedding (the ViTs, faster under XLA on a CPU; the convolutional networks, "
        "DeepDanbooru's ResNets included, were slower and train as before). MaxPooling2D then trains as an equal "
        "maximum over strided slices. Results match the uncompiled run to float rounding, not bitwise; "
        "docs/performance.md has the measurements", "bool or \"auto\"", "true, false, \"auto\"", spec=False),
    # The recipe keys. Defaults: DeepDanbooru's recipe, unchanged.
    Key("asl_gamma_neg", 4.0, _float(0.0), "loss asymmetric: focusing exponent of the negatives", "float", ">= 0",
        spec=False),
    Key("asl_gamma_pos", 0.0, _float(0.0), "loss asymmetric: focusing exponent of the positives", "float", ">= 0",
        spec=False),
    Key("asl_clip", 0.05, _float(0.0, 0.5),
        "loss asymmetric: probability margin subtracted from a negative's score (0: no shifting)", "float",
        "0 to 0.5", spec=False),
    Key("weight_decay", None, _optional_float(minimum=0.0),
        f"optimizer adamw or lamb: decoupled weight decay (times the learning rate), not applied to biases, "
        f"normalization parameters, layer scales and position tables; null: {DEFAULT_WEIGHT_DECAY}",
        "float or null", ">= 0", spec=False),
    Key("layer_decay", None, _optional_float(minimum=0.0, maximum=1.0, exclusive_minimum=True),
        "layer-wise learning-rate decay for fine-tuning: with L blocks (vit, eva02) or stages (resnet, convnext, "
        "efficientnetv2, swinv2), counted on the model trained (a --source-model's own), block i from 0 learns "
        "at the rate times layer_decay ** (L - i), the stem at layer_decay ** (L + 1), the head at the rate "
        "itself (null: off)", "float or null", "0 < d <= 1",
        spec=False),
    Key("lr_schedule", "steps", _choice(LR_SCHEDULES),
        "steps: learning_rate / learning_rates per epoch; warmup_cosine: per minibatch, linear warmup to "
        "learning_rate over warmup_epochs, then cosine down to min_learning_rate at the end of epoch_count",
        "str", ", ".join(LR_SCHEDULES), spec=False),
    Key("warmup_epochs", 1.0, _float(0.0), "lr_schedule warmup_cosine: length of the linear warmup, in epochs",
        "float", ">= 0", spec=False),
    Key("min_learning_rate", 0.0, _float(0.0), "lr_schedule warmup_cosine: the rate the cosine ends at", "float",
        ">= 0, <= learning_rate", spec=False),
    Key("ema_decay", None, _optional_float(minimum=0.0, maximum=1.0, exclusive_minimum=True, exclusive_maximum=True),
        "keep an exponential moving average of the weights (decay per minibatch) in the checkpoint; validation "
        "and exports use it; the decay warms up as min(d, (1+n)/(10+n)) after n steps so early weights do not "
        "linger (null: off)", "float or null", "0 < d < 1", spec=False),
    Key("head_bias_init", "zeros", _choice(HEAD_BIAS_INITS),
        "from scratch, the output bias of each tag: zeros, or log_prior (the log-odds of its frequency in the "
        "training records; models whose head has a bias)", "str", ", ".join(HEAD_BIAS_INITS), spec=False),
    Key("tag_loss_weights", None, _optional_choice(TAG_LOSS_WEIGHTS),
        "null: every tag weighs 1 in the loss; log_frequency: 1 + ln(records / tag count), scaled to mean 1, "
        "so rarer tags weigh more", "str or null", ", ".join(TAG_LOSS_WEIGHTS), spec=False),
    Key("horizontal_flip", False, _bool, "mirror each training image left-right with probability 1/2", "bool",
        "true, false", spec=False),
    Key("crop_area_range", None, _range(positive=True, maximum=1.0),
        "random resized crop: the part of the image kept, as a fraction of its area (same proportions, "
        "anywhere inside), is drawn from [lo, hi] and fills the output; null or [] disables",
        "[lo, hi] or null", "0 < lo <= hi <= 1", spec=False),
    Key("mixup", None, _optional_float(minimum=0.0, exclusive_minimum=True),
        "mixup alpha: each training image and its labels are mixed with another of its batch, with a "
        "Beta(alpha, alpha) weight (null: off)", "float or null", "> 0", spec=False),
    Key("backbone_weights", None, _optional_path,
        "weights for the model's trunk, loaded when training starts from scratch (the head starts fresh); "
        "a relative path is resolved against the project directory; see docs/training.md", "str or null",
        "a .weights.h5 / .h5 of the trunk, a .keras model of the same architecture, or a timm checkpoint folder "
        "(config.json + model.safetensors) of a ViT or ConvNeXt of the same size", spec=False),
    Key("freeze_backbone_epochs", 0, _int(0),
        "train only the head (trunk frozen, its batch norm on moving statistics) for the first N epochs",
        "int", ">= 0", spec=False),
    Key("trainable_blocks", None, _or_null(_int(0)),
        "partial fine-tuning for the whole run: only the last N blocks (vit) or stages (resnet, convnext, "
        "efficientnetv2, swinv2) of the trunk, counted on the model trained (a --source-model's own), train with "
        "the top layers and the head; 0: the head alone; the rest is frozen (no gradients, no optimizer state, "
        "its batch norm on moving statistics); null: every layer", "int or null",
        ">= 0, at most the model's block count", spec=False),
    Key("wise_ft", None, _mixing_weights,
        "with --source-model: the final export (and a --time-limit stop's) holds (1 - a) * start + a * trained "
        "for every weight the run trains, a the one of this list scoring the best validation mAP, start the "
        "weights the run began from (the source, its head mapped onto tags.txt); training and every other export "
        "are unchanged (WiSE-FT weight-space ensembling, see docs/finetuning.md); a checkpoint written without it "
        "does not resume with it; null: the trained weights",
        "list of numbers or null", "each 0 <= a <= 1, at least one", spec=False),
    Key("source_distillation", None, _optional_float(minimum=0.0, exclusive_minimum=True),
        "with --source-model: each training picture's loss also has weight * the mean over tags.txt of BCE(the "
        "start's score, the model's score) on the tags the source knows, the start being the weights the run "
        "began from, run on the same batch (learning without forgetting, see docs/finetuning.md); a checkpoint "
        "written without it does not resume with it; null: the labels alone",
        "float or null", "> 0", spec=False),
    Key("weight_decay_toward", None, _optional_choice(DECAY_TOWARD),
        "optimizer adamw or lamb, with --source-model: what the decoupled weight decay pulls each weight toward; "
        "start: the value the run began from, w -= rate * weight_decay * (w - start) (L2-SP; the head's columns of "
        "tags the source does not know toward zero), so a larger weight_decay holds the fine-tune nearer the "
        "source (see docs/finetuning.md); a checkpoint written without it does not resume with it; null or zero: "
        "toward zero", "str or null", ", ".join(DECAY_TOWARD), spec=False),
    Key("known_head_rate", None, _optional_float(minimum=0.0),
        "with --source-model: the head's kernel columns and bias entries of the tags the source knows move this "
        "many times as far each step as the optimizer moves them (their learning rate and decay times it; the "
        "rest of the network and the new tags' rows at the full rate); a checkpoint written without it does not "
        "resume with it; null: the full rate", "float or null", ">= 0", spec=False),
    Key("resample_positions", False, _bool,
        "with a ViT or EVA02 timm checkpoint folder as --source-model whose input size is not image_width x "
        "image_height: resample its position table bicubically to the project's token grid (EVA02's rotary "
        "embedding is recomputed for it, as timm does) (false: refuse the size)",
        "bool", "true, false", spec=False),
    Key("padding", "border", _choice(PADDING_MODES),
        "what surrounds a picture that is not of the model's proportions, and what rotations and shifts uncover, "
        "in training, validation, evaluate (unless evaluate --padding) and conv2tflite's sample images: border "
        "(repeat the edge pixels) or white (as the WD tagger tools pad, and as WD's models were trained)", "str",
        ", ".join(PADDING_MODES), spec=False),
    Key("alpha", "drop", _choice(ALPHA_MODES),
        "transparency of PNG and WebP pictures in training, validation, evaluate-project --metrics and grad-cam: "
        "drop (the stored colours) or white (composited onto white, as the tagger tools do); evaluate and "
        "evaluate-project's tagging composite onto white unless evaluate --alpha drop", "str",
        ", ".join(ALPHA_MODES), spec=False),
    Key("pack_quality", 95, _int(50, 100),
        "JPEG quality of the pictures `deepdanbooru pack` stores in shards/: lower takes less disk and decodes "
        "faster, and the pictures move further from the originals (90: a third less disk, 8-20% less CPU a "
        "picture, 1.9 levels of 255 from quality 95's pixels on average; docs/performance.md); changing it "
        "makes packed shards stale", "int", "50 to 100", spec=False),
    Key("data_service", None, _optional_address,
        "HOST:PORT of a tf.data service dispatcher whose workers make the training batches on other hosts "
        "(null: this host's CPUs make them); see docs/distributed.md", "str or null", "HOST:PORT", spec=False),
)
KEY_BY_NAME = {key.name: key for key in KEYS}

# A key that only one setting of another key reads: giving it with any other setting is an error,
# so a value that would be silently ignored never looks like it took effect.
USED_ONLY_WITH = {
    "asl_gamma_neg": ("loss", ("asymmetric",)),
    "asl_gamma_pos": ("loss", ("asymmetric",)),
    "asl_clip": ("loss", ("asymmetric",)),
    "weight_decay": ("optimizer", ("adamw", "lamb")),
    "weight_decay_toward": ("optimizer", ("adamw", "lamb")),
    "warmup_epochs": ("lr_schedule", ("warmup_cosine",)),
    "min_learning_rate": ("lr_schedule", ("warmup_cosine",)),
    "learning_rates": ("lr_schedule", ("steps",)),
}

# What create-project writes: DeepDanbooru's keys in its order plus the ones of ours a new
# project should see. learning_rates is absent by default, as DeepDanbooru left it.
NEW_PROJECT_OVERRIDES = {"validation_fraction": 0.05}


@dataclass(frozen=True)
class ProjectConfig:
    project_dir: Path
    image_width: int
    image_height: int
    database_path: Path | None
    minimum_tag_count: int
    model: str
    minibatch_size: int
    epoch_count: int | str  # a number, or FIT
    export_model_per_epoch: int
    checkpoint_frequency_mb: int
    console_logging_frequency_mb: int
    loss: str
    optimizer: str
    learning_rate: float
    learning_rates: tuple[LearningRateStep, ...] | None
    rotation_range: tuple[float, float] | None
    scale_range: tuple[float, float] | None
    shift_range: tuple[float, float] | None
    mixed_precision: bool
    seed: int
    image_extensions: tuple[str, ...]
    max_bad_image_fraction: float
    max_image_pixels: int
    validation_fraction: float
    validation_frequency_slices: int
    validation_threshold: float
    best_model_metric: str
    gradient_clip_norm: float | None
    jit_compile: bool | str  # True, False or JIT_AUTO (compiling.xla_pays decides once the model is built)
    asl_gamma_neg: float
    asl_gamma_pos: float
    asl_clip: float
    weight_decay: float | None
    layer_decay: float | None
    lr_schedule: str
    warmup_epochs: float
    min_learning_rate: float
    ema_decay: float | None
    head_bias_init: str
    tag_loss_weights: str | None
    horizontal_flip: bool
    crop_area_range: tuple[float, float] | None
    mixup: float | None
    backbone_weights: Path | None
    freeze_backbone_epochs: int
    trainable_blocks: int | None
    wise_ft: tuple[float, ...] | None
    source_distillation: float | None
    weight_decay_toward: str | None
    known_head_rate: float | None
    resample_positions: bool
    padding: str
    alpha: str
    pack_quality: int
    data_service: str | None
    unknown_keys: tuple[str, ...] = field(default=())

    @property
    def config_path(self) -> Path:
        return self.project_dir / PROJECT_FILE

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.image_height, self.image_width, 3)

    def learning_rate_for_epoch(self, epoch: int, epoch_count: float | None = None) -> float:
        """The steps schedule's rate for epoch `epoch` (0-based). epoch_count: the count used_fraction entries
        are placed over (None: project.json's number; math.inf, as "fit" before it has planned: not placed)."""
        if epoch_count is None:
            epoch_count = math.inf if self.epoch_count == FIT else self.epoch_count
        rate = self.learning_rate
        for step in self.learning_rates or ():
            if step.first_epoch(epoch_count) <= epoch:
                rate = step.learning_rate
        return rate

    def require_backbone_weights(self) -> Path | None:
        """The backbone_weights path, checked to exist (null: None)."""
        path = self.backbone_weights
        if path is not None and path.is_dir() and not (path / "config.json").is_file():
            raise ConfigError(file_field(self.config_path, "backbone_weights",
                                         f"folder {path} has no config.json (a timm checkpoint folder has "
                                         "config.json and model.safetensors)"))
        if path is not None and not path.exists():
            raise ConfigError(file_field(self.config_path, "backbone_weights", f"file not found: {path}"))
        return path

    @property
    def decay(self) -> float | None:
        """The weight decay the optimizer applies (None: the optimizer has none)."""
        if self.optimizer not in USED_ONLY_WITH["weight_decay"][1]:
            return None
        return DEFAULT_WEIGHT_DECAY if self.weight_decay is None else self.weight_decay

    def require_epoch_count(self, time_limit: float | None) -> None:
        """epoch_count "fit" plans from train-project's --time-limit: without one it is refused in one line."""
        if self.epoch_count == FIT and time_limit is None:
            raise ConfigError(file_field(self.config_path, "epoch_count", (
                f'"{FIT}" plans the epochs that fit train-project\'s --time-limit, and none was given; give '
                f"--time-limit (e.g. --time-limit 6m) or set epoch_count to a number of epochs")))

    def require_database(self) -> Path:
        """The database path, checked to exist (training and preflight need it)."""
        if self.database_path is None:
            raise ConfigError(file_field(self.config_path, "database_path",
                                         "is null; set it to the SQLite file of your dataset"))
        if not self.database_path.is_file():
            what = "is a folder, not the SQLite file" if self.database_path.is_dir() else "file not found"
            raise ConfigError(file_field(self.config_path, "database_path", f"{what}: {self.database_path}"))
        return self.database_path


assert [k.name for k in KEYS] == [f.name for f in fields(ProjectConfig)][1:-1]


def parse_config(raw: Any, project_dir: Path, source: Path | None = None,
                 uses: tuple[str, ...] | None = None) -> ProjectConfig:
    """Validate a decoded project.json object.

    uses: the keys the calling command reads (None: all). A bad value of another key is a warning and
    that key keeps its default, so a command is never refused over a setting it does not use.
    """
    source = source or project_dir / PROJECT_FILE
    if not isinstance(raw, dict):
        raise ConfigError(file_field(source, None, f"must hold a JSON object, got {type(raw).__name__}"))
    used = set(KEY_BY_NAME if uses is None else uses)
    # Every problem is collected, so one run names them all instead of one per attempt.
    problems: list[str] = []
    values: dict[str, Any] = {}
    invalid: set[str] = set()  # keys whose value was refused: their default must not be reported as their value
    for key in KEYS:
        if key.name not in raw:
            values[key.name] = key.default
            continue
        try:
            values[key.name] = key.check(raw[key.name])
        except _Invalid as error:
            message = file_field(source, key.name, str(error))
            if key.name in used:
                problems.append(message)
            else:
                warnings.warn(f"{message} (not used by this command; fix it before training)", UserWarning,
                              stacklevel=2)
            values[key.name] = key.default
            invalid.add(key.name)
    problems.extend(_combination_problems(raw, values, source, used - invalid, invalid))
    unknown = tuple(sorted(name for name in raw if name not in KEY_BY_NAME))
    for name in unknown:
        meant = _meant_keys(name)
        if meant and used.intersection(meant):
            # A misspelt key, or another tool's name for one, would silently train on the default for hours.
            what = (f"did you mean {meant[0]!r}?" if name.lower() not in OTHER_TOOLS_KEYS else
                    f"another tool's name; deepdanbooru's is {' and '.join(meant)}")
            stays = " and ".join(f"{key} would stay {_show(values[key])}" for key in meant)
            problems.append(file_field(source, name, f"unknown key; {what} (as written it would be ignored and "
                                                     f"{stays})"))
            continue
        hint = f" (did you mean {' and '.join(map(repr, meant))}?)" if meant else _did_you_mean(name, KEY_BY_NAME)
        warnings.warn(f"{source}: unknown key {name!r} is ignored{hint}", UserWarning, stacklevel=2)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems: " + "; ".join(problems), problems)
    values["database_path"] = _project_path(values["database_path"], project_dir)
    values["backbone_weights"] = _project_path(values["backbone_weights"], project_dir)
    return ProjectConfig(project_dir=project_dir, unknown_keys=unknown, **values)


def _project_path(value: str | None, project_dir: Path) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else project_dir / path


def _combination_problems(raw: dict, values: dict, source: Path, used: set, invalid: set) -> list[str]:
    # Like a bad value, a combination is refused only by a command that reads the keys involved, and not over a
    # key whose own value was refused (that is reported already).
    problems = []
    for name, (owner, settings) in USED_ONLY_WITH.items():
        if name in used and owner not in invalid and raw.get(name) is not None and values[owner] not in settings:
            problems.append(file_field(source, name, f"is used only with {owner} {' or '.join(settings)}, but "
                                                     f"{owner} is {_show(values[owner])}; remove it or change "
                                                     f"{owner}"))
    if {"epoch_count", "learning_rates"} <= used and values["epoch_count"] == FIT:
        problems.extend(_fixed_drops_under_fit(raw, values["learning_rates"] or (), source))
    if "min_learning_rate" in used and values["lr_schedule"] == "warmup_cosine" and values["min_learning_rate"] > values["learning_rate"]:
        problems.append(file_field(source, "min_learning_rate", f"must be <= learning_rate "
                                                                f"({values['learning_rate']}), got "
                                                                f"{_show(raw['min_learning_rate'])}"))
    return problems


def _fixed_drops_under_fit(raw: dict, steps, source: Path) -> list[str]:
    """A drop at used_epoch 27 is an epoch, not a share of a length: "fit" would move the end under it. An entry
    at used_epoch 0 (the rate from the start) does not move and stays allowed."""
    fixed = [index for index, step in enumerate(steps) if step.used_epoch]
    if not fixed:
        return []
    index, epoch = fixed[0], steps[fixed[0]].used_epoch
    written_for = _recipe_epoch_count(raw.get("learning_rates"))
    if written_for:
        shares = ", ".join(f"used_epoch {steps[i].used_epoch} of epoch_count {written_for} is used_fraction "
                           f"{steps[i].used_epoch / written_for:.4g}" for i in fixed)
    else:
        shares = (f"used_fraction is used_epoch / the epoch_count the drops were written for: used_epoch {epoch} "
                  f"of epoch_count N is used_fraction {epoch}/N")
    return [file_field(source, "learning_rates", (
        f'entry {index}: used_epoch {epoch} is a fixed epoch, which epoch_count "{FIT}" cannot stretch over the epochs it plans; '
        f"give the drops as used_fraction, the share of the epochs after which each applies ({shares}), use "
        f'lr_schedule "warmup_cosine", or set epoch_count to a number'))]


def _recipe_epoch_count(entries) -> int | None:
    """The numeric epoch_count of the create-project recipe whose learning_rates these entries are, if any."""
    for recipe in RECIPES.values():
        if entries and recipe.get("learning_rates") == entries and isinstance(recipe.get("epoch_count"), int):
            return recipe["epoch_count"]
    return None


def load_config(project_dir, uses: tuple[str, ...] | None = None) -> ProjectConfig:
    """Read PROJECT/project.json into a ProjectConfig, or raise ConfigError naming file and key.

    uses: the keys the command reads (see parse_config); None checks them all.
    """
    project_dir = Path(project_dir)
    source = project_dir / PROJECT_FILE
    if not project_dir.is_dir():
        raise ConfigError(f"{project_dir}: project directory not found")
    if not source.is_file():
        raise ConfigError(file_field(source, None, "not found; create it with `deepdanbooru create-project`"))
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(file_field(source, None, f"cannot be read: {error}")) from None
    try:
        # NaN and Infinity (not JSON, but Python writes them) are read as numbers, so the key's
        # check refuses them with the key named.
        repeated = []
        raw = json.loads(text, object_pairs_hook=lambda pairs: _noting_repeated_keys(pairs, repeated))
    except json.JSONDecodeError as error:
        raise ConfigError(file_field(source, None, json_error_text(error))) from None
    except RecursionError:
        raise ConfigError(file_field(source, None, "invalid JSON: nested too deeply to read")) from None
    for key in dict.fromkeys(repeated):
        # JSON readers (DeepDanbooru's too) keep the last; a project that trained so keeps training so.
        warnings.warn(file_field(source, key, "given more than once; the last one is used: keep only the one you "
                                              "mean"), UserWarning, stacklevel=2)
    return parse_config(raw, project_dir, source, uses)


def _noting_repeated_keys(pairs, repeated: list) -> dict:
    """json's object hook: the object as json builds it (the last of a repeated key wins), noting repeats."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            repeated.append(key)
        seen[key] = value
    return seen


def default_project_json() -> dict[str, Any]:
    """The JSON object create-project writes: DeepDanbooru's keys in its order, then ours a new project should set."""
    data = {}
    for key in KEYS:
        if key.spec and key.name != "learning_rates":
            data[key.name] = list(key.default) if isinstance(key.default, tuple) else key.default
    data.update(NEW_PROJECT_OVERRIDES)
    return data
