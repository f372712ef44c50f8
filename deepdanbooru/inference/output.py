"""Turning scores into tags, and tags into text, JSON Lines or CSV.

numpy only (no TensorFlow), so the formats are testable on their own.
"""

from __future__ import annotations

import csv
import io
import json
import sys

import numpy as np

from deepdanbooru.errors import ModelError, file_field
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


def select_tags(tags, scores, thresholds) -> list[tuple[str, float]]:
    """(tag, score) for every score >= its threshold, in tags.txt order (as DeepDanbooru lists them)."""
    chosen = np.flatnonzero(np.asarray(scores) >= thresholds)
    return [(tags[i], float(scores[i])) for i in chosen]


def caption(pairs) -> str:
    """The --save-txt content: 'tag1, tag2', the sidecar format captioning tools read."""
    return ", ".join(tag for tag, _ in pairs)


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
