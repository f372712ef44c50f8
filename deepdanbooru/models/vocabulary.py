"""The vocabulary a model file records: its tags, one per output unit, inside the file itself.

Standard library only (zipfile): train-project plans a run, --source-model included, before TensorFlow starts.

A .keras file is a zip archive; Keras reads the members it wrote (config.json, metadata.json,
model.weights.h5) and ignores others, so every export carries `deepdanbooru/tags.txt` (one tag a line,
in output order) and stays a plain Keras model that keras.models.load_model opens. The tags travel
with the file when it is copied or renamed, and no sidecar has to exist. A file re-saved by another
tool (e.g. loaded and saved again with plain Keras) loses the member; then the thresholds.csv beside
it, or --source-tags, says which tags it was trained on.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

TAGS_MEMBER = "deepdanbooru/tags.txt"


def write_model_tags(keras_file, tags) -> None:
    """Add the tags to a .keras file just written (before it is renamed into place)."""
    text = "".join(f"{tag}\n" for tag in tags)
    with zipfile.ZipFile(keras_file, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(TAGS_MEMBER, text)


def read_model_tags(model_file) -> tuple[str, ...] | None:
    """The tags a model file records, or None (not a .keras zip, written without them, unreadable)."""
    path = Path(model_file)
    if path.suffix.lower() != ".keras":
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            if TAGS_MEMBER not in archive.namelist():
                return None
            text = archive.read(TAGS_MEMBER).decode("utf-8")
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError):
        return None
    return tuple(line for line in text.splitlines() if line)
