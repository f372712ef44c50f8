"""Model exports: written whole or not at all, without optimizer state.

Keras 3 writes the optimizer of a compiled model into a .keras file whatever
include_optimizer says, so the trainer never compiles the model it trains,
and `export_model` refuses a model that carries an optimizer.

Each save goes to a private directory beside the target and is renamed into
place when complete (models.files.save_atomic, shared with import-model).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import keras

from deepdanbooru.models.files import PARTIAL as _PARTIAL
from deepdanbooru.models.files import save_atomic
from deepdanbooru.models.precision import with_policy
from deepdanbooru.training.strategy import portable_batch_norm

__all__ = ["export_model", "remove_partial_exports", "save_atomic"]


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


def remove_partial_checkpoints(checkpoints) -> list[Path]:
    """Delete the folders a checkpoint save killed midway leaves (TensorFlow writes `ckpt-N_temp/` and renames
    its files out of it when done); call with the training lock held, so none is live."""
    return _remove_folders(checkpoints, "*_temp")


def remove_partial_exports(directory) -> list[Path]:
    """Delete the staging directories a killed run left (call with the training lock held, so none is live)."""
    return _remove_folders(directory, f".*{_PARTIAL}*")


def _remove_folders(directory, pattern: str) -> list[Path]:
    removed = []
    for candidate in sorted(Path(directory).glob(pattern)):
        if candidate.is_dir() and not candidate.is_symlink():
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed
