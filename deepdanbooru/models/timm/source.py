"""A checkpoint folder in the Hugging Face timm layout: config.json, model.safetensors, selected_tags.csv.

Standard library only (the tensors are read in models.timm.safetensors).
Only `architecture` and `model_args` decide what is built, as in
timm.create_model; `pretrained_cfg` gives the input size and the mean and
standard deviation the weights were trained with.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.project import categories as cat

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TAGS_FILE = "selected_tags.csv"
CHANNEL_ORDERS = ("rgb", "bgr")
TAG_COLUMNS = ("tag_id", "name", "category", "count")


@dataclass(frozen=True)
class CheckpointSource:
    folder: Path
    architecture: str
    num_classes: int
    model_args: dict
    input_size: tuple[int, int]  # (height, width)
    mean: tuple[float, float, float]  # in the channel order the weights expect
    std: tuple[float, float, float]
    channel_order: str
    channel_order_reason: str
    # Names from selected_tags.csv, else config.json's label_names when they can be tags, else None.
    tags: tuple[str, ...] | None
    categories: tuple[int, ...] | None  # WD category ids from selected_tags.csv, else None

    @property
    def config_path(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def weights_path(self) -> Path:
        return self.folder / WEIGHTS_FILE


# The model_args that size a network, with the word each takes in its name. timm's architecture name alone names
# the network its function builds with no arguments: vit_base_patch16_224 with depth 6 and embed_dim 192 is a
# 6-block, 192-wide network, so the name every export, checkpoint and report gives it is
# vit_base_patch16_224-depth6-dim192. An argument the architecture name already says (patch16, window8, _224)
# is left out.
SIZE_ARGS = (("depth", "depth"), ("depths", "depths"), ("embed_dim", "dim"), ("dims", "dims"),
             ("num_heads", "heads"), ("mlp_ratio", "mlp"), ("patch_size", "patch"), ("window_size", "window"),
             ("img_size", "img"))


def _name_part(value) -> str:
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and value[0] == value[1]:  # a square size
            return _name_part(value[0])
        return "_".join(_name_part(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}".replace(".", "p").replace("-", "m")
    return str(value)


def network_name(source: CheckpointSource, input_size=None) -> str:
    """The name of the network the folder builds (at `input_size` (height, width) when it is resized): the
    architecture, then each sizing argument its name does not already say."""
    args = dict(source.model_args)
    if input_size is not None:
        args["img_size"] = list(input_size)
    said = set(re.findall(r"(?:patch|window)\d+|_\d+$", source.architecture))
    parts = []
    for key, word in SIZE_ARGS:
        if key not in args:
            continue
        value = _name_part(args[key])
        if (word in ("patch", "window") and f"{word}{value}" in said) or (word == "img" and f"_{value}" in said):
            continue
        parts.append(f"{word}{value}")
    return "-".join([source.architecture, *parts])


def is_checkpoint_folder(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / CONFIG_FILE).is_file()


def _number_list(value, length: int, path: Path, field: str) -> tuple:
    if (not isinstance(value, list) or len(value) != length
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ModelError(file_field(path, field, f"must be a list of {length} numbers, got {value!r}"))
    return tuple(value)


def read_config(folder) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelError(file_field(folder, None, "is not a folder (expected a checkpoint folder with config.json "
                                                  "and model.safetensors)"))
    path = folder / CONFIG_FILE
    for required in (path, folder / WEIGHTS_FILE):
        if not required.is_file():
            found = "is a folder, not a file" if required.is_dir() else "not found"
            raise ModelError(file_field(required, None, f"{found} (a timm checkpoint folder holds config.json and "
                                                        "model.safetensors)"))
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelError(file_field(path, None, f"cannot be read as JSON: {error}")) from None
    if not isinstance(config, dict):
        raise ModelError(file_field(path, None, "must be a JSON object"))
    return config


def read_source(folder, channel_order: str | None = None, need_head: bool = True) -> CheckpointSource:
    """The folder's config and tags, checked; `channel_order` None picks bgr with selected_tags.csv, else rgb."""
    folder = Path(folder)
    config = read_config(folder)
    path = folder / CONFIG_FILE
    architecture = config.get("architecture")
    if not isinstance(architecture, str) or not architecture:
        what = "missing" if architecture in (None, "") else f"{architecture!r} is not text"
        raise ModelError(file_field(path, "architecture", f"{what} (the timm model name, e.g. vit_base_patch16_224)"))
    if "model_args" not in config:
        raise ModelError(file_field(path, "model_args", "missing: timm builds the model from architecture and "
                                                        "model_args, so without them the shape is unknown "
                                                        "(write \"model_args\": {} for the architecture's defaults)"))
    model_args = config["model_args"]
    if not isinstance(model_args, dict):
        raise ModelError(file_field(path, "model_args", "must be a JSON object"))
    # timm.create_model drops null arguments: the architecture's default applies.
    model_args = {key: value for key, value in model_args.items() if value is not None}
    pretrained = config.get("pretrained_cfg", {})
    if not isinstance(pretrained, dict):
        raise ModelError(file_field(path, "pretrained_cfg", "must be a JSON object"))
    # As timm.create_model: model_args first, then the top-level num_classes, then pretrained_cfg's.
    num_classes = model_args.get("num_classes", config.get("num_classes", pretrained.get("num_classes")))
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ModelError(file_field(path, "num_classes", f"must be a non-negative integer, got {num_classes!r}"))
    if need_head and num_classes == 0:
        raise ModelError(file_field(path, "num_classes", "is 0: the checkpoint has no head to import (a trunk "
                                                         "without head can start training as backbone_weights)"))
    try:
        size = pretrained["input_size"]
        mean, std = pretrained["mean"], pretrained["std"]
    except KeyError as error:
        raise ModelError(file_field(path, f"pretrained_cfg.{error.args[0]}", "missing")) from None
    channels, height, width = _number_list(size, 3, path, "pretrained_cfg.input_size")
    if channels != 3 or not all(isinstance(d, int) and d > 0 for d in (height, width)):
        raise ModelError(file_field(path, "pretrained_cfg.input_size", f"must be [3, height, width], got {size!r}"))
    if pretrained.get("fixed_input_size") and "img_size" not in model_args:
        # timm builds a model whose pretrained_cfg says fixed_input_size (ViTs do) for input_size.
        model_args = {**model_args, "img_size": [height, width]}
    mean = _number_list(mean, 3, path, "pretrained_cfg.mean")
    std = _number_list(std, 3, path, "pretrained_cfg.std")
    if not all(s > 0 for s in std):
        raise ModelError(file_field(path, "pretrained_cfg.std", f"must be positive, got {list(std)}"))
    tags = categories = None
    labels = config.get("label_names", pretrained.get("label_names"))
    if _usable_labels(labels, num_classes):
        tags = tuple(labels)
    tags_path = folder / TAGS_FILE
    if tags_path.is_file():
        tags, categories = read_selected_tags(tags_path)
        if need_head and len(tags) != num_classes:
            raise ModelError(file_field(tags_path, None, f"has {len(tags)} tag rows but the head has {num_classes} "
                                                         f"outputs (num_classes of {path})"))
    if channel_order is None:
        channel_order = "bgr" if categories is not None else "rgb"
        reason = (f"bgr: {TAGS_FILE} marks a WD tagger, trained on BGR" if categories is not None else
                  f"rgb: no {TAGS_FILE}, so not a WD tagger; timm's own checkpoints expect RGB")
    else:
        channel_order = channel_order.lower()
        if channel_order not in CHANNEL_ORDERS:
            raise ModelError(f"--channel-order: must be one of {', '.join(CHANNEL_ORDERS)}, got {channel_order!r}")
        reason = f"{channel_order}: as given"
    return CheckpointSource(folder, architecture, num_classes, model_args, (height, width), mean, std,
                            channel_order, reason, tags, categories)


def _usable_labels(labels, count: int) -> bool:
    """label_names that can be tags: one per output, unique, no whitespace (else outputs are class_N)."""
    return (isinstance(labels, list) and len(labels) == count and len(set(labels)) == count
            and all(isinstance(label, str) and label and not any(ch.isspace() for ch in label) for label in labels))


def read_selected_tags(path) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, category ids) from a WD selected_tags.csv; one line naming the row for a bad one."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ModelError(file_field(path, None, f"cannot be read: {error}")) from None
    if not rows or tuple(cell.strip() for cell in rows[0][:4]) != TAG_COLUMNS:
        raise ModelError(file_field(path, "line 1", f"header must start with {','.join(TAG_COLUMNS)}"))
    names, categories, seen = [], [], {}
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) < 4:
            raise ModelError(file_field(path, f"line {number}", f"has {len(row)} columns, expected at least 4"))
        # Some taggers' lists spell 'long hair'; a tag holds no spaces (tag strings split on them).
        name = "_".join(row[1].split())
        if not name:
            raise ModelError(file_field(path, f"line {number}", "tag name is empty"))
        if name in seen:
            raise ModelError(file_field(path, f"line {number}", f"duplicate tag {name!r} (first on line "
                                                                f"{seen[name]})"))
        try:
            category = int(row[2])
        except ValueError:
            raise ModelError(file_field(path, f"line {number}", f"category {row[2]!r} is not an integer")) from None
        if category not in cat.LABELS:
            known = ", ".join(f"{k} {v}" for k, v in sorted(cat.LABELS.items()))
            raise ModelError(file_field(path, f"line {number}", f"unknown category {category} (known: {known})"))
        seen[name] = number
        names.append(name)
        categories.append(category)
    if not names:
        raise ModelError(file_field(path, None, "holds no tag rows"))
    return tuple(names), tuple(categories)


def class_names(source: CheckpointSource) -> tuple[str, ...]:
    """The head's row names: selected_tags.csv's or label_names, else class_0, class_1, ..."""
    if source.tags is not None:
        return source.tags
    digits = len(str(source.num_classes - 1))
    return tuple(f"class_{index:0{digits}d}" for index in range(source.num_classes))


def categories_json(categories) -> list[dict]:
    """DeepDanbooru's categories.json entries for per-tag category ids: one entry per run of equal ids."""
    entries = []
    for index, category in enumerate(categories):
        if not entries or entries[-1][1] != category:
            entries.append((index, category))
    return [{"name": cat.LABELS[category], "start_index": start} for start, category in entries]
