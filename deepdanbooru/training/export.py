"""Model exports: written whole or not at all, without optimizer state.

Keras 3 writes the optimizer of a compiled model into a .keras file whatever
include_optimizer says, so the trainer never compiles the model it trains,
and `export_model` refuses a model that carries an optimizer.

Each save goes to a private directory beside the target and is renamed into
place when complete (models.files.save_atomic, shared with import-model).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import keras

from deepdanbooru.models.files import PARTIAL as _PARTIAL
from deepdanbooru.models.files import save_atomic
from deepdanbooru.models.precision import with_policy
from deepdanbooru.training.strategy import portable_batch_norm

__all__ = ["export_model", "remove_partial_exports", "save_atomic"]


def export_model(model: keras.Model, path, float32_copy: Path | None = None) -> list[Path]:
    """Write `path` and, when asked, a float32 rebuild of the model beside it. Returns what was written."""
    with portable_batch_norm(model):
        written = [save_atomic(model, path)]
        if float32_copy is not None:
            written.append(save_atomic(with_policy(model, "float32"), float32_copy))
    return written


def remove_partial_exports(directory) -> list[Path]:
    """Delete the staging directories a killed run left (call with the training lock held, so none is live)."""
    removed = []
    for candidate in sorted(Path(directory).glob(f".*{_PARTIAL}*")):
        if candidate.is_dir() and not candidate.is_symlink():
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed
