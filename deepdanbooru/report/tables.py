"""The page's data: one column array per tag field, the pictures it shows and the gallery's order (numpy).

Numbers are rounded to what a reader can tell apart (scores to 3 decimals, curves to 0.001 as integers),
which keeps a 10,000-tag page small (docs/evaluation.md).
"""

from __future__ import annotations

import math

import numpy as np

from deepdanbooru.project.categories import LABELS

CURVE_STEP = 20  # every 20th of the 1,000 bins: 51 points per curve
GALLERY = 120  # pictures in the gallery, worst first


def _round(values, digits=4):
    return [None if value is None or not math.isfinite(value) else round(float(value), digits) for value in values]


def tag_columns(tags, categories, train_counts, validation_counts, result, source_ap=None) -> dict:
    per_tag = result["per_tag"]
    support = per_tag["support"]
    tp, fp, fn = per_tag["tp"], per_tag["fp"], per_tag["fn"]
    precision_fixed = np.divide(tp, tp + fp, out=np.zeros(len(tags)), where=(tp + fp) > 0)
    recall_fixed = np.divide(tp, support, out=np.zeros(len(tags)), where=support > 0)
    f1_fixed = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros(len(tags)), where=(2 * tp + fp + fn) > 0)
    columns = {
        "name": list(tags),
        "category": [LABELS.get(category, "") if category is not None else "" for category in categories],
        "train": [int(count) for count in train_counts],
        "validation": [int(count) for count in validation_counts],
        "ap": _round(per_tag["ap"]),
        "f1": _round(per_tag["f1"]),
        "precision": _round(per_tag["precision"]),
        "recall": _round(per_tag["recall"]),
        "threshold": _round(per_tag["threshold"], 3),
        "calibrated": [bool(value) for value in per_tag["calibrated"]],
        "withheld": [bool(value) for value in per_tag["withheld"]],
        "f1_fixed": _round(f1_fixed),
        "precision_fixed": _round(precision_fixed),
        "recall_fixed": _round(recall_fixed),
    }
    for name in ("ap", "f1", "precision", "recall", "f1_fixed", "precision_fixed", "recall_fixed"):
        # A tag without a positive in the split has no figure to show (0 would read as "learned nothing").
        columns[name] = [value if count > 0 else None for value, count in zip(columns[name], support)]
    if source_ap is not None:
        columns["source_ap"] = [_round([source_ap[tag]])[0] if source_ap.get(tag) is not None else None
                                for tag in tags]
    return columns


def curve_arrays(thresholds, precision, recall) -> dict:
    """Per tag, precision and recall as integers in thousandths (a list per tag)."""
    return {
        "thresholds": _round(thresholds, 3),
        "precision": np.rint(precision * 1000).astype(np.int32).tolist(),
        "recall": np.rint(recall * 1000).astype(np.int32).tolist(),
    }


def pictures_and_gallery(collector, thresholds, records, gallery_size: int = GALLERY):
    """(pictures, gallery, worst): the pictures the page shows, the gallery's entries (indices into pictures,
    worst first) and per tag its worst candidates [[picture, score], ...] for "fp" and "fn"."""
    thresholds = np.asarray(thresholds, dtype=np.float32)
    errors = [collector.picture_errors(index, thresholds) for index in range(len(collector))]
    order = sorted(range(len(errors)), key=lambda i: (-errors[i]["errors"], -errors[i]["margin"],
                                                      errors[i]["position"]))
    pictures, by_position = [], {}

    def picture(position: int) -> int:
        if position not in by_position:
            by_position[position] = len(pictures)
            pictures.append({"id": int(records.ids[position]), "path": records.path(position)})
        return by_position[position]

    gallery = []
    for index in order[:gallery_size]:
        entry = errors[index]
        number = picture(entry["position"])
        pictures[number].update({
            "hits": [[tag, round(score, 3)] for tag, score in entry["hits"]],
            "missed": [[tag, round(score, 3)] for tag, score in entry["missed"]],
            "wrong": [[tag, round(score, 3)] for tag, score in entry["wrong"]],
            "more_wrong": entry["more_wrong"],
            "errors": entry["errors"],
        })
        gallery.append(number)
    worst = {"fp": [], "fn": []}
    for tag in range(collector.n_tags):
        negatives, positives = collector.tag_candidates(tag)
        worst["fp"].append([[picture(position), round(score, 3)] for position, score in negatives])
        worst["fn"].append([[picture(position), round(score, 3)] for position, score in positives])
    return pictures, gallery, worst


def vocabulary_section(entries, tags) -> dict | None:
    """For a grown vocabulary: kept and new tags (indices into tags.txt) and the dropped tags' names."""
    if not entries:
        return None
    index = {tag: number for number, tag in enumerate(tags)}
    groups = {"kept": [], "new": [], "dropped": []}
    for kind, tag in entries:
        groups[kind].append(index[tag] if kind != "dropped" and tag in index else tag)
    return groups
