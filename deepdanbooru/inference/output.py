"""Turning scores into tags, and tags into text, JSON Lines or CSV.

numpy only (no TensorFlow), so the formats are testable on their own.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

from deepdanbooru.captions import tag_key
from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.project.categories import CATEGORIES_FILE, CHARACTER, GENERAL, LABELS
from deepdanbooru.scoring.thresholds import read_thresholds_csv

FORMATS = ("text", "json", "csv")


def print_err(message: str) -> None:
    """The default for the `echo_err` of library functions: one line to the current stderr."""
    print(message, file=sys.stderr)


def threshold_vector(tags, threshold: float, thresholds_csv=None) -> np.ndarray:
    """One threshold per output: from the CSV where it names the tag, else `threshold`.

    A CSV naming a tag the model does not have was made for another model;
    using it would silently misplace every threshold, so it is refused.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ModelError(f"--threshold: must be in [0, 1], got {threshold}")
    vector = np.full(len(tags), threshold, dtype=np.float32)
    if thresholds_csv is None:
        return vector
    index = {tag: position for position, tag in enumerate(tags)}
    for tag, value in read_thresholds_csv(thresholds_csv).items():
        if tag not in index:
            raise ModelError(file_field(thresholds_csv, "tag",
                                        f"{tag!r} is not in the model's tags.txt (thresholds of another model?)"))
        vector[index[tag]] = value
    return vector


def set_category_thresholds(vector, categories, source, general=None, character=None) -> None:
    """--general-threshold / --character-threshold: one threshold for every tag of that category.

    They replace the per-tag CSV's values for those tags too: the user named them for this run.
    categories: one Danbooru category id (or None) per tag, read from the categories file `source`
    (model_files.ModelFiles.categories).
    """
    for option, value, category in (("--general-threshold", general, GENERAL),
                                    ("--character-threshold", character, CHARACTER)):
        if value is None:
            continue
        indices = [index for index, known in enumerate(categories) if known == category]
        if not indices:
            if Path(source).is_file():
                why = "lists none"
            elif Path(source).name == CATEGORIES_FILE:
                why = "is missing (download-tags writes it)"
            else:
                why = ("is missing (import-model writes it beside the model it imports; a project's categories.json "
                       "beside the model serves too)")
            raise ModelError(f"{option}: no tag of the model is known as a {LABELS[category]} tag: {source} {why}")
        vector[indices] = value


def drop_undesired(vector, tags, undesired: str, echo_err=print_err) -> None:
    """--undesired-tags 'a, b': those tags are never reported, whatever their score or spelling."""
    wanted = {tag_key(item): item.strip() for item in undesired.split(",") if item.strip()}
    found = set()
    for index, tag in enumerate(tags):
        if tag_key(tag) in wanted:
            vector[index] = np.inf
            found.add(tag_key(tag))
    for key, item in wanted.items():
        if key not in found:
            echo_err(f"note: --undesired-tags: {item!r} is not one of the model's tags")


def select_tags(tags, scores, thresholds, by_score: bool = False) -> list[tuple[str, float]]:
    """(tag, score) for every score >= its threshold, in tags.txt order (as DeepDanbooru lists them)
    or, by_score, highest score first."""
    scores = np.asarray(scores)
    chosen = np.flatnonzero(scores >= thresholds)
    if by_score:
        chosen = chosen[np.argsort(-scores[chosen], kind="stable")]
    return [(tags[i], float(scores[i])) for i in chosen]


class TextWriter:
    """DeepDanbooru's layout: a header line per image, '(score) tag' lines, a blank line."""

    def __init__(self, echo):
        self.echo = echo

    def image(self, path, pairs):
        lines = [f"Tags of {path}:"]
        lines.extend(f"({score:05.3f}) {tag}" for tag, score in pairs)
        self.echo("\n".join(lines) + "\n")


class JsonLinesWriter:
    """One JSON object per image and line, written as soon as it is known (large folders stream)."""

    def __init__(self, echo):
        self.echo = echo

    def image(self, path, pairs):
        record = {"path": str(path), "tags": {tag: round(score, 6) for tag, score in pairs}}
        self.echo(json.dumps(record, ensure_ascii=False))


class CsvWriter:
    """Long format: a header, then one row per (image, predicted tag)."""

    def __init__(self, echo):
        self.echo = echo
        self.echo(self._row(("path", "tag", "score")))

    @staticmethod
    def _row(values) -> str:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="").writerow(values)
        return buffer.getvalue()

    def image(self, path, pairs):
        for tag, score in pairs:
            self.echo(self._row((str(path), tag, f"{score:.6f}")))


WRITERS = {"text": TextWriter, "json": JsonLinesWriter, "csv": CsvWriter}


def make_writer(output_format: str, echo):
    return WRITERS[output_format](echo)
