"""Opening model files: ours (.keras) and DeepDanbooru 1.0's (.keras, legacy .h5); saving one whole or not at all.

A save goes to a private directory beside the target and is renamed into
place when complete; Keras is told to stage the weights on disk there rather
than in memory (compat.weights_staged_on_disk).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import keras

from deepdanbooru import compat
from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.sourceinfo import check_keras_archive
from deepdanbooru.models.vocabulary import write_model_tags

MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")


class _LegacyPolicy:
    """tf.keras 2.x wrote mixed-precision layers' dtype as class "Policy" (or
    "PolicyV1" with a loss scale), which Keras 3 no longer knows; its name is
    all that matters when loading."""

    @classmethod
    def from_config(cls, config):
        return keras.DTypePolicy(config["name"])


_LEGACY_OBJECTS = {"Policy": _LegacyPolicy, "PolicyV1": _LegacyPolicy}


def load_model_file(path) -> keras.Model:
    """Open a whole-model file without its training configuration.

    DeepDanbooru 1.0 saved compiled models (optimizer, loss, metrics of
    tf.keras 2.x); compile=False skips all of that, so only the layers and
    weights have to be understood.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(file_field(path, None, "model file not found"))
    if path.suffix.lower() not in MODEL_SUFFIXES:
        raise ModelError(file_field(path, None, f"expected a {' or '.join(MODEL_SUFFIXES)} model file"))
    if path.suffix.lower() == ".keras":
        check_keras_archive(path)
    try:
        model = keras.models.load_model(path, compile=False, custom_objects=_LEGACY_OBJECTS)
    except Exception as error:  # Keras raises anything from OSError to TypeError here.
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        raise ModelError(file_field(path, None, f"cannot be opened as a Keras model: {reason}")) from error
    return _single_input_output(model, path)


def _single_input_output(model, path):
    # Legacy configs list inputs and outputs even when there is one of each,
    # which Keras 3 turns into list-valued predictions.
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ModelError(
            file_field(path, None, f"expected one image input and one output, found "
                       f"{len(model.inputs)} inputs and {len(model.outputs)} outputs")
        )
    # A Sequential model has no `input` of its own once loaded: the same graph as a functional model has.
    if isinstance(model, keras.Sequential) or isinstance(model.input, list) or isinstance(model.output, list):
        model = keras.Model(model.inputs[0], model.outputs[0], name=model.name)
    return model


PARTIAL = ".partial-"


def _partial_dir(path: Path) -> Path:
    # Hidden, beside the target (same file system, so the rename is atomic); the pid keeps two writers apart.
    return path.with_name(f".{path.stem}{PARTIAL}{os.getpid()}")


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
