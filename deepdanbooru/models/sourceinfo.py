"""What a --source-model trains as, known before TensorFlow starts (standard library only): the network's name
and, for a timm checkpoint folder, its parameter count with the head mapped onto tags.txt.

preflight names the network a fine-tune will train by the name its checkpoints, exports and report give it
(training.network: the Keras model's name), not project.json's `model`, which a --source-model run does not build.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.timm.safetensors import read_header
from deepdanbooru.models.timm.source import is_checkpoint_folder, network_name, read_source


@dataclass(frozen=True)
class SourceNetwork:
    name: str | None  # None: the file does not say (an .h5 file, a .keras file without its config)
    parameters: int | None  # with the head mapped onto tags.txt; None: counted only when the model is built
    outputs: int | None  # the source's own head rows


def check_keras_archive(path: Path) -> None:
    """One line naming the .keras file `path` when it cannot be a model Keras saved (not a zip archive, or one
    without config.json). Keras itself says "File not found" of such a file, which is there."""
    problem = _keras_archive_problem(Path(path))
    if problem is not None:
        raise ModelError(file_field(path, None, f"cannot be opened as a Keras model: {problem}; a .keras model is a "
                                                "zip archive as Keras saves it"))


def _keras_archive_problem(path: Path) -> str | None:
    if not zipfile.is_zipfile(path):
        size = path.stat().st_size
        return "it is empty (0 bytes)" if size == 0 else \
            f"it is not a whole zip archive ({size:,} bytes: cut short, or another kind of file)"
    try:
        with zipfile.ZipFile(path) as archive:
            archive.getinfo("config.json")
    except KeyError:
        return "it holds no config.json (a zip archive, but not a model Keras saved)"
    except (OSError, zipfile.BadZipFile) as error:
        return f"it is a damaged zip archive ({error})"
    return None


def _keras_name(path: Path) -> str | None:
    check_keras_archive(path)
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json").decode("utf-8"))
    except (OSError, KeyError, zipfile.BadZipFile, UnicodeDecodeError, ValueError):
        return None
    name = (config.get("config") or {}).get("name") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name else None


def source_network(path, tags: int | None, input_size=None) -> SourceNetwork:
    """The network `path` (a --source-model) trains as in a project of `tags` tags; `input_size` (height, width):
    the project's, when a timm folder's position table is resampled to it (resample_positions)."""
    path = Path(path)
    if not is_checkpoint_folder(path):
        return SourceNetwork(_keras_name(path) if path.suffix.lower() == ".keras" else None, None, None)
    source = read_source(path)
    resized = input_size is not None and tuple(input_size) != tuple(source.input_size)
    name = network_name(source, input_size if resized else None)
    tensors, _ = read_header(source.weights_path)
    if resized:  # the position table's length changes with the grid: counted when the model is built
        return SourceNetwork(name, None, source.num_classes)
    total = sum(math.prod(info.shape) for info in tensors.values())
    head = [info.shape for key, info in tensors.items()
            if key.startswith("head") and info.shape and info.shape[0] == source.num_classes]
    widths = [shape[1] for shape in head if len(shape) == 2]
    if tags is not None and len(widths) == 1:
        total += (tags - source.num_classes) * (widths[0] + sum(1 for shape in head if len(shape) == 1))
    elif tags is not None and tags != source.num_classes:
        return SourceNetwork(name, None, source.num_classes)
    return SourceNetwork(name, total, source.num_classes)
