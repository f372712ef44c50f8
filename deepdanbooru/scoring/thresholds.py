"""Threshold search over F1 curves, and the `*.thresholds.csv` file.

numpy only. A curve holds one F1 value per candidate threshold k / bins,
k = 0 .. bins (index order = ascending threshold).
"""

from __future__ import annotations

import csv
import io
import math

import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.fileio import write_text_atomic

THRESHOLD_COLUMNS = ("tag", "threshold", "precision", "recall", "f1", "support")


def ratios(numerator, denominator) -> np.ndarray:
    """numerator / denominator elementwise, 0 where the denominator is 0."""
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    out = np.zeros(np.broadcast(numerator, denominator).shape, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def f1_scores(tp, fp, fn) -> np.ndarray:
    """2tp / (2tp + fp + fn): equal to the harmonic mean of precision and recall,
    and defined (as 0) when a tag has neither positives nor predictions."""
    tp = np.asarray(tp, dtype=np.float64)
    return ratios(2.0 * tp, 2.0 * tp + fp + fn)


def best_threshold_indices(curves) -> np.ndarray:
    """Per curve, the index of the threshold to use.

    Thresholds between two occupied bins give identical counts, so the maximum
    usually spans a run of indices. Its upper end sits right at the lowest score
    still predicted; the middle of the run keeps a margin on both sides, which
    matters most for tags with few positives. Of several runs reaching the
    maximum, the highest-threshold one is used.
    """
    curves = np.atleast_2d(np.asarray(curves, dtype=np.float64))
    width = curves.shape[1]
    positions = np.arange(width)
    at_max = curves == curves.max(axis=1, keepdims=True)
    high = width - 1 - np.argmax(at_max[:, ::-1], axis=1)
    below_run = np.where(~at_max & (positions[None, :] < high[:, None]), positions[None, :], -1)
    low = below_run.max(axis=1) + 1
    return (low + high) // 2


def equal_point(precision, recall) -> int:
    """Index where an ascending-threshold precision curve meets the recall curve, found by bisection.

    At index 0 (threshold 0) every image is predicted, so recall is 1 and
    precision the base rate; at the top recall has fallen to (nearly) 0.
    Bisection keeps precision < recall at `low` and precision >= recall at
    `high` until they are neighbours, then returns whichever is closer to
    equality (`high` on a tie). Precision need not rise monotonically, so on
    a curve that crosses several times this is one of the crossings, the same
    one for the same curves.
    """
    difference = np.asarray(precision, dtype=np.float64) - np.asarray(recall, dtype=np.float64)
    low, high = 0, len(difference) - 1
    if difference[low] >= 0:
        return low
    if difference[high] < 0:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if difference[middle] >= 0:
            high = middle
        else:
            low = middle
    return low if -difference[low] < difference[high] else high


def _format_score(value: float) -> str:
    return f"{value:.6f}"


def write_thresholds_csv(path, tags, result) -> None:
    """tag, threshold, precision, recall, f1, support: one row per tag, in tags.txt order.

    precision, recall and f1 are measured at that row's threshold; support is the
    number of validation samples carrying the tag.
    """
    per_tag = result["per_tag"]
    if len(tags) != len(per_tag["threshold"]):
        raise ValueError(f"{len(tags)} tags for {len(per_tag['threshold'])} metric rows")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(THRESHOLD_COLUMNS)
    for index, tag in enumerate(tags):
        writer.writerow((
            tag,
            repr(float(per_tag["threshold"][index])),
            _format_score(per_tag["precision"][index]),
            _format_score(per_tag["recall"][index]),
            _format_score(per_tag["f1"][index]),
            int(per_tag["support"][index]),
        ))
    write_text_atomic(path, buffer.getvalue())


def read_thresholds_csv(path) -> dict[str, float]:
    """tag -> threshold from a file written by write_thresholds_csv (other columns are ignored)."""
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            rows = list(csv.reader(stream))
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(file_field(path, None, f"cannot read: {error}")) from error
    if not rows or "tag" not in rows[0] or "threshold" not in rows[0]:
        raise ModelError(file_field(path, "header", "needs the columns tag and threshold"))
    tag_column = rows[0].index("tag")
    threshold_column = rows[0].index("threshold")
    thresholds: dict[str, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        field = f"line {line}"
        if len(row) <= max(tag_column, threshold_column):
            raise ModelError(file_field(path, field, "too few columns"))
        tag = row[tag_column]
        try:
            value = float(row[threshold_column])
        except ValueError:
            raise ModelError(file_field(path, field, f"threshold {row[threshold_column]!r} is not a number")) from None
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ModelError(file_field(path, field, f"threshold {value} is not in [0, 1]"))
        if tag in thresholds:
            raise ModelError(file_field(path, field, f"tag {tag!r} appears twice"))
        thresholds[tag] = value
    return thresholds
