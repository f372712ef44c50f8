"""Model exports: written whole or not at all, without optimizer state.

Keras 3 writes the optimizer of a compiled model into a .keras file whatever
include_optimizer says, so the trainer never compiles the model it trains,
and `export_model` refuses a model that carries an optimizer.

Each save goes to a private directory beside the target and is renamed into
place when complete; Keras is told to stage the weights on disk there rather
than in memory (compat.weights_staged_on_disk).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import keras

from deepdanbooru import compat
from deepdanbooru.models.precision import with_policy
from deepdanbooru.models.vocabulary import write_model_tags
from deepdanbooru.training.strategy import portable_batch_norm

_PARTIAL = ".partial-"


def _partial_dir(path: Path) -> Path:
    # Hidden, beside the target (same file system, so the rename is atomic); the pid keeps two writers apart.
    return path.with_name(f".{path.stem}{_PARTIAL}{os.getpid()}")


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_atomic(model: keras.Model, path, tags=None) -> Path:
    """Save `model` into a staging directory beside `path`, then rename the file into place.
    `tags`: the vocabulary, one per output unit, recorded inside the file (models.vocabulary)."""
    path = Path(path)
    if getattr(model, "optimizer", None) is not None:
        raise ValueError("refusing to export a compiled model: Keras would write its optimizer state")
    staging = _partial_dir(path)
    staging.mkdir(exist_ok=True)
    partial = staging / path.name  # still ending in .keras: Keras checks the suffix
    try:
        with compat.weights_staged_on_disk():
            model.save(partial)
        if tags is not None:
            write_model_tags(partial, tags)
        _fsync(partial)
        os.replace(partial, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


@contextlib.contextmanager
def whole_trainable(model: keras.Model):
    """Every layer trainable while inside, as it was afterwards.

    A layer's trainable flag is part of the saved config: a model exported while its trunk is frozen
    (freeze_backbone_epochs; the best model too, exported from inside validation) would load with a
    frozen trunk and, used as --source-model, fit no checkpoint of the model it continues.
    """
    frozen = [layer for layer in model.layers if not layer.trainable]
    for layer in frozen:
        layer.trainable = True
    try:
        yield
    finally:
        for layer in frozen:
            layer.trainable = False


def export_model(model: keras.Model, path, float32_copy: Path | None = None, tags=None) -> list[Path]:
    """Write `path` and, when asked, a float32 rebuild of the model beside it, every layer trainable,
    each recording `tags` when given. Returns what was written."""
    if tags is not None and len(tags) != int(model.output_shape[-1]):
        raise ValueError(f"{len(tags)} tags for a model of {model.output_shape[-1]} outputs")
    with whole_trainable(model), portable_batch_norm(model):
        written = [save_atomic(model, path, tags)]
        if float32_copy is not None:
            written.append(save_atomic(with_policy(model, "float32"), float32_copy, tags))
    return written


def remove_partial_exports(directory) -> list[Path]:
    """Delete the staging directories a killed run left (call with the training lock held, so none is live)."""
    removed = []
    for candidate in sorted(Path(directory).glob(f".*{_PARTIAL}*")):
        if candidate.is_dir() and not candidate.is_symlink():
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed
