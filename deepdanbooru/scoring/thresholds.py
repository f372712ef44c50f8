"""Threshold search over F1 curves, and the `*.thresholds.csv` file.

numpy only. A curve holds one F1 value per candidate threshold k / bins,
k = 0 .. bins (index order = ascending threshold).
"""

from __future__ import annotations

import csv
import io
import math
from typing import NamedTuple

import numpy as np

from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.fileio import write_text_atomic

THRESHOLD_COLUMNS = ("tag", "threshold", "precision", "recall", "f1", "support", "ap", "use", "reason")
# The "use" column: the tag's own threshold, the shared fallback, or never emitted by default.
OWN, FALLBACK, WITHHELD = "own", "fallback", "withheld"


class ThresholdPolicy:
    """Which tags get their own threshold and which are withheld by default (docs/metrics.md).

    A threshold fitted on the validation split also fits its noise, so a tag gets its own only with enough
    positives (min_support), a ranking good enough to threshold (AP >= MIN_AP: below it most pictures above
    any threshold lack the tag, and the F1-best threshold sits low, on many pictures) and a gain over the
    working threshold large enough to outlast that noise (MIN_GAIN in F1). A tag is withheld when its
    predictions at its threshold were mostly wrong on validation (precision under MIN_PRECISION over at
    least MIN_PREDICTIONS predictions: each such tag costs a caption more than it adds) or when it would
    land on over half the pictures, mostly wrongly, while fewer than half carry it.
    """

    MIN_AP = 0.2
    MIN_GAIN = 0.02
    MIN_PRECISION = 0.1
    MIN_PREDICTIONS = 3

    def __init__(self, min_support: int):
        self.min_support = int(min_support)

    def own_threshold(self, support, ap, own_f1, working_f1) -> np.ndarray:
        ap = np.nan_to_num(np.asarray(ap, dtype=np.float64), nan=0.0)
        return ((np.asarray(support) >= self.min_support) & (ap >= self.MIN_AP)
                & (np.asarray(own_f1) - np.asarray(working_f1) >= self.MIN_GAIN))

    def withhold(self, tp, fp, support, samples: int) -> np.ndarray:
        tp, fp, support = (np.asarray(value, dtype=np.int64) for value in (tp, fp, support))
        predicted = tp + fp
        wrong = (predicted >= self.MIN_PREDICTIONS) & (tp < self.MIN_PRECISION * predicted)
        everywhere = (2 * predicted > samples) & (2 * support < samples) & (2 * tp < predicted)
        return wrong | everywhere

    def reasons(self, per_tag: dict, fallback: float, working: float, samples: int) -> list[str]:
        """One short reason per tag: why it has the threshold (or the withholding) it has."""
        out = []
        for index in range(len(per_tag["support"])):
            support, ap = int(per_tag["support"][index]), float(per_tag["ap"][index])
            predicted = int(per_tag["predicted"][index])
            if per_tag["withheld"][index]:
                if 2 * predicted > samples and 2 * support < samples:
                    out.append(f"would land on {predicted} of {samples} validation pictures, mostly wrongly; "
                               f"{support} carry it")
                else:
                    out.append(f"mostly wrong on validation: {predicted} predictions at "
                               f"{per_tag['threshold'][index]:.3f}, precision under {self.MIN_PRECISION:g}")
                continue
            if per_tag["calibrated"][index]:
                out.append(f"F1 {per_tag['own_f1'][index]:.3f} at its own threshold against "
                           f"{per_tag['working_f1'][index]:.3f} at {working:g} (AP {ap:.3f}, {support} positives)")
            elif support == 0:
                out.append(f"no positive in validation: the fallback {fallback:g}")
            elif support < self.min_support:
                out.append(f"{support} positives (under {self.min_support}): the fallback {fallback:g}")
            elif not ap >= self.MIN_AP:
                out.append(f"AP {ap:.3f} (under {self.MIN_AP:g}): the fallback {fallback:g}")
            else:
                out.append(f"its own threshold gains under {self.MIN_GAIN:g} F1 "
                           f"({per_tag['own_f1'][index]:.3f} against {per_tag['working_f1'][index]:.3f} at "
                           f"{working:g}): the fallback {fallback:g}")
        return out


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


def default_thresholds(per_tag: dict) -> np.ndarray:
    """The threshold each tag is predicted at by default: its threshold, or inf for a withheld tag (never)."""
    return np.where(np.asarray(per_tag["withheld"], dtype=bool), np.inf,
                    np.asarray(per_tag["threshold"], dtype=np.float64))


def write_thresholds_csv(path, tags, result) -> None:
    """tag, threshold, precision, recall, f1, support, ap, use, reason: one row per tag, in tags.txt order.

    precision, recall and f1 are what the default thresholds give on validation (0 for a withheld tag, which
    is never emitted); support is the number of validation samples carrying the tag; use is own, fallback or
    withheld, and reason says why.
    """
    per_tag = result["per_tag"]
    if len(tags) != len(per_tag["threshold"]):
        raise ValueError(f"{len(tags)} tags for {len(per_tag['threshold'])} metric rows")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(THRESHOLD_COLUMNS)
    for index, tag in enumerate(tags):
        ap = float(per_tag["ap"][index])
        use = WITHHELD if per_tag["withheld"][index] else OWN if per_tag["calibrated"][index] else FALLBACK
        writer.writerow((
            tag,
            repr(float(per_tag["threshold"][index])),
            _format_score(per_tag["precision"][index]),
            _format_score(per_tag["recall"][index]),
            _format_score(per_tag["f1"][index]),
            int(per_tag["support"][index]),
            "" if math.isnan(ap) else _format_score(ap),
            use,
            per_tag["reason"][index],
        ))
    write_text_atomic(path, buffer.getvalue())


class ThresholdRow(NamedTuple):
    threshold: float  # as written; a withheld row's too
    f1: float | None  # on validation, when the file says
    use: str  # own, fallback, withheld, or "" in a file without the column


def read_thresholds_csv(path) -> dict[str, float]:
    """tag -> threshold from a file written by write_thresholds_csv; a row whose use is "withheld" gives
    infinity (never emitted). Other columns are ignored, and a file without a use column (one written before
    it, or by hand) is read by its thresholds alone."""
    return {tag: math.inf if row.use == WITHHELD else row.threshold for tag, row in read_threshold_rows(path).items()}


def read_threshold_rows(path) -> dict[str, ThresholdRow]:
    """tag -> ThresholdRow, checked: one clear line naming the file and line for a bad row."""
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            rows = list(csv.reader(stream))
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(file_field(path, None, f"cannot read: {error}")) from error
    if not rows or "tag" not in rows[0] or "threshold" not in rows[0]:
        raise ModelError(file_field(path, "header", "needs the columns tag and threshold"))
    header = rows[0]
    tag_column, threshold_column = header.index("tag"), header.index("threshold")
    use_column = header.index("use") if "use" in header else None
    f1_column = header.index("f1") if "f1" in header else None
    thresholds: dict[str, ThresholdRow] = {}
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
        use = row[use_column].strip() if use_column is not None and use_column < len(row) else ""
        if use not in ("", OWN, FALLBACK, WITHHELD):
            raise ModelError(file_field(path, field, f"use {use!r} is not one of {OWN}, {FALLBACK}, {WITHHELD}"))
        try:
            f1 = float(row[f1_column]) if f1_column is not None and f1_column < len(row) and row[f1_column] else None
        except ValueError:
            f1 = None
        thresholds[tag] = ThresholdRow(value, f1, use)
    return thresholds


def describe_threshold_rows(rows: dict) -> str:
    """'12 own, 430 at the fallback 0.56, 5 withheld (never emitted)': what a thresholds file holds."""
    uses = [row.use for row in rows.values()]
    if not any(uses):
        return f"{len(rows)} tags"
    fallback = sorted({round(row.threshold, 6) for row in rows.values() if row.use == FALLBACK})
    at = f" {fallback[0]:g}" if len(fallback) == 1 else ""
    return (f"{uses.count(OWN)} own, {uses.count(FALLBACK)} at the fallback{at}, "
            f"{uses.count(WITHHELD)} withheld (never emitted)")
