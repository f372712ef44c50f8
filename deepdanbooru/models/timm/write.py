"""import-model: a timm checkpoint folder -> FILE.keras, with its tags and categories beside it.

Beside FILE.keras go the files the rest of the tool reads for a model:
FILE.tags.txt (the head's rows in order, one tag a line; evaluate
--model-path and train-project --source-model read it beside the model) and, when the folder has a selected_tags.csv,
FILE.categories.json (DeepDanbooru's format, as download-tags writes: copy it
with the tags into a project as tags.txt and categories.json, and
evaluate-project, validation and export-bundle see ratings, general and
character tags).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.models.timm.source import categories_json

SUFFIX = ".keras"


@dataclass(frozen=True)
class ImportReport:
    model: Path
    tags: Path
    categories: Path | None


def beside(path: Path) -> tuple[Path, Path]:
    """(tags file, categories file) written beside the model FILE.keras."""
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem
    return path.with_name(f"{stem}.tags.txt"), path.with_name(f"{stem}.categories.json")


def check_destination(path, overwrite: bool) -> Path:
    path = Path(path)
    if path.suffix.lower() != SUFFIX:
        raise ModelError(file_field(path, None, f"the model is written as a Keras file: give a name ending in "
                                                f"{SUFFIX}"))
    folder = next((parent for parent in path.parents if parent.exists()), None)
    if folder is not None and not folder.is_dir():
        raise ModelError(file_field(folder, None, "is not a folder; give a path inside a folder"))
    if not overwrite:
        for existing in (path, *beside(path)):
            if existing.exists():
                raise ModelError(file_field(existing, None, "already exists; use --overwrite to replace it"))
    return path


def import_model(source, save_path, channel_order=None, overwrite=False, echo=print) -> ImportReport:
    """Check everything, then write FILE.keras's tags (and categories) and the model itself, the model last."""
    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.models.files import save_atomic

    path = check_destination(save_path, overwrite)
    imported = import_checkpoint(source, channel_order)
    height, width = imported.input_size
    echo(f"{imported.source.architecture}: {len(imported.tags):,} outputs, input {height}x{width} RGB in [0, 1] "
         f"(mean {list(imported.source.mean)} and std {list(imported.source.std)} folded in)")
    echo(f"Channel order the weights expect: {imported.channel_order_reason} (--channel-order to change)")
    tags_path, categories_path = beside(path)
    # A missing folder is made only now, once the checkpoint has been read, so bad input leaves nothing behind.
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(tags_path, "".join(f"{tag}\n" for tag in imported.tags))
    if imported.categories is not None:
        write_text_atomic(categories_path, json.dumps(categories_json(imported.categories), indent=2) + "\n")
    else:
        categories_path = None
    save_atomic(imported.model, path, tags=imported.tags)
    written = ", ".join(str(p) for p in (tags_path, categories_path) if p is not None)
    echo(f"Wrote {path} and {written}")
    return ImportReport(path, tags_path, categories_path)
