"""Out-of-sample scores of the project's posts: from a fold's export, or a model that never saw them.

The pictures are prepared as evaluate prepares them (the shared inference pipeline, the project's
padding and alpha), so a score here is the one a user would see tagging the picture.
A model from elsewhere answers for the tags it shares with tags.txt by name (captions.tag_key: any
spelling of a tag, WD's rating rows as the project's rating: tags); the other tags are not audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru.captions import tag_key
from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.wording import plural


@dataclass(frozen=True)
class OutsideModel:
    path: Path
    columns: list[int]  # positions in tags.txt of the tags the model knows
    outputs: list[int]  # the model's output for each of them
    folder: bool


def match_model(path, tags) -> OutsideModel:
    """--model-path's vocabulary against tags.txt, before TensorFlow starts; one line when none is shared."""
    from deepdanbooru.training.source import read_source_model

    source = read_source_model(path, option="--model-path")
    if source.tags is None:
        raise ModelError(file_field(path, None, (
            "records no tags and has no .tags.txt or .thresholds.csv beside it; the audit matches the model's "
            "tags to tags.txt by name")))
    outputs = {}
    for index, tag in enumerate(source.tags):
        outputs.setdefault(tag_key(tag), index)
    columns = [index for index, tag in enumerate(tags) if tag_key(tag) in outputs]
    if not columns:
        raise ModelError(file_field(path, None, (
            f"none of its {plural(len(source.tags), 'tag')} (e.g. {', '.join(source.tags[:3])}) is a tag of "
            f"tags.txt (e.g. {', '.join(tags[:3])}); nothing to audit with it")))
    return OutsideModel(source.path, columns, [outputs[tag_key(tags[index])] for index in columns], source.folder)


def load_outside_model(outside: OutsideModel):
    if outside.folder:
        from deepdanbooru.models.timm.checkpoint import import_checkpoint

        return import_checkpoint(outside.path).model
    from deepdanbooru.models.files import load_model_file

    return load_model_file(outside.path)


def score_records(model, model_path, config, records, outputs, batch_size: int, echo=print,
                  what: str = "posts") -> tuple[np.ndarray, np.ndarray]:
    """(indices into records that were read, their scores at the model's `outputs`), unreadable
    pictures named on one line each and left out."""
    from deepdanbooru.inference.predict import Tagger
    from deepdanbooru.pipeline import Fill

    tagger = Tagger(model, [], model_path, config, config.max_image_pixels, fill=Fill.from_config(config))
    paths = records.paths()
    kept, rows = [], []
    outputs = np.asarray(outputs, dtype=np.int64)

    def skipped(index, reason):
        echo(f"warning: {paths[index]}: not scored: {reason}")

    width = model.output_shape[-1]
    if outputs.size and int(outputs.max()) >= width:
        raise ModelError(file_field(model_path, "output", f"has {width} scores, fewer than the tags it names"))
    echo(f"Scoring {plural(len(paths), 'post')} ({what}) with {Path(model_path).name}")
    for index, row in tagger.predict(paths, batch_size, skipped):
        kept.append(index)
        rows.append(row[outputs])
    scores = np.stack(rows) if rows else np.zeros((0, len(outputs)), dtype=np.float32)
    return np.asarray(kept, dtype=np.int64), scores
