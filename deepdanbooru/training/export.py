"""Model exports: written whole or not at all, without optimizer state.

Keras 3 writes the optimizer of a compiled model into a .keras file whatever
include_optimizer says, so the trainer never compiles the model it trains,
and `export_model` refuses a model that carries an optimizer.
"""

from __future__ import annotations

import os
from pathlib import Path

import keras

from deepdanbooru.training.precision import with_policy
from deepdanbooru.training.strategy import portable_batch_norm

_PARTIAL = ".partial-"


def _partial_path(path: Path) -> Path:
    # Hidden and still ending in .keras (Keras checks the suffix); the pid keeps two writers apart.
    return path.with_name(f".{path.stem}{_PARTIAL}{os.getpid()}.keras")


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_atomic(model: keras.Model, path) -> Path:
    """Save `model` to a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    if getattr(model, "optimizer", None) is not None:
        raise ValueError("refusing to export a compiled model: Keras would write its optimizer state")
    partial = _partial_path(path)
    try:
        model.save(partial)
        _fsync(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def export_model(model: keras.Model, path, float32_copy: Path | None = None) -> list[Path]:
    """Write `path` and, when asked, a float32 rebuild of the model beside it. Returns what was written."""
    with portable_batch_norm(model):
        written = [save_atomic(model, path)]
        if float32_copy is not None:
            written.append(save_atomic(with_policy(model, "float32"), float32_copy))
    return written


def remove_partial_exports(directory) -> list[Path]:
    """Delete temporaries left by a killed run (call with the training lock held, so none is live)."""
    removed = []
    for candidate in Path(directory).glob(f".*{_PARTIAL}*.keras"):
        candidate.unlink(missing_ok=True)
        removed.append(candidate)
    return removed
