"""Streaming validation metrics for multi-label tagging (numpy only).

Feed batches of sigmoid outputs and multi-hot labels to ValidationMetrics.update;
result() gives loss, micro/macro precision, recall and F1 at the working
threshold, mAP, MCC, the global threshold that maximises micro-F1, per-tag
thresholds that maximise each tag's F1, and the figures published taggers are
compared by (the threshold where macro precision equals macro recall, macro-F1
and macro-MCC at 0.4), also per tag category when categories are given.
docs/metrics.md explains how to read them.

Memory does not grow with the number of samples: besides exact counts at the
working threshold, each tag keeps two histograms (positives, negatives) of its
scores over `bins` equal bins of [0, 1]. Slot k counts scores s with
k/bins <= s < (k+1)/bins (slot `bins` holds s == 1.0), so the number of
scores >= k/bins is the exact tail sum from slot k: every count, precision,
recall and F1 at a threshold k/bins is exact, and threshold search is over
those bins + 1 values. Only average precision is approximate: scores sharing a
bin are treated as tied.
"""

from __future__ import annotations

import json
import math

import numpy as np

from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.scoring.thresholds import (  # noqa: F401  (re-exported: one import for callers)
    best_threshold_indices,
    equal_point,
    f1_scores,
    ratios,
    ThresholdPolicy,
    read_thresholds_csv,
    write_thresholds_csv,
)

DEFAULT_BINS = 1000
DEFAULT_MIN_SUPPORT = 10

# int32 histograms halve the memory of a large vocabulary (10,000 tags x 1,001
# slots x 2 = 80 MB); this is the sample count at which a slot could overflow.
MAX_SAMPLES = int(np.iinfo(np.int32).max)

# scores * bins is within ~1e-11 of the exact product for bins <= MAX_BINS, so
# only values this close to an integer can land in the wrong slot.
_EDGE_MARGIN = 1e-6
MAX_BINS = 100_000

# Bounds the temporaries of result(): tags are processed this many slots at a time.
_RESULT_CHUNK_ELEMENTS = 1 << 20

# The fixed threshold of the published "macro-F1@0.4" / "MCC@0.4" figures (animetimm, JoyTag cards).
FIXED_THRESHOLD = 0.4

# Metrics where a lower value is better; every other scalar metric is higher-is-better.
LOWER_IS_BETTER = frozenset({"loss"})


def _mcc(tp: int, fp: int, fn: int, tn: int) -> float:
    denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    if denominator == 0:
        return 0.0
    return (tp * tn - fp * fn) / math.sqrt(denominator)


def _mcc_values(tp, fp, fn, tn) -> np.ndarray:
    """Elementwise MCC (float64 products: int64 would overflow on large splits); 0 where a factor is 0."""
    tp, fp, fn, tn = (np.asarray(value, dtype=np.float64) for value in (tp, fp, fn, tn))
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return ratios(tp * tn - fp * fn, denominator)


def _tails(counts: np.ndarray) -> np.ndarray:
    """Along the last axis, out[..., k] = sum of counts[..., k:] (= scores >= k/bins)."""
    return np.cumsum(counts[..., ::-1], axis=-1, dtype=np.int64)[..., ::-1]


class ValidationMetrics:
    """Accumulates validation predictions batch by batch; see the module docstring."""

    def __init__(self, n_tags: int, threshold: float = 0.5, bins: int = DEFAULT_BINS,
                 min_support: int = DEFAULT_MIN_SUPPORT, categories: dict | None = None):
        """categories: {"general": [tag indices], ...}; each gets its own published figures in result()."""
        if int(n_tags) < 1:
            raise ValueError(f"n_tags must be >= 1, got {n_tags}")
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if not 1 <= int(bins) <= MAX_BINS:
            raise ValueError(f"bins must be in [1, {MAX_BINS}], got {bins}")
        if int(min_support) < 1:
            raise ValueError(f"min_support must be >= 1, got {min_support}")
        self.n_tags = int(n_tags)
        self.threshold = float(threshold)
        self.bins = int(bins)
        self.min_support = int(min_support)
        self.categories = {name: np.asarray(indices, dtype=np.int64) for name, indices in (categories or {}).items()}
        for name, indices in self.categories.items():
            if indices.size and (indices.min() < 0 or indices.max() >= self.n_tags):
                raise ValueError(f"category {name!r} has tag indices outside [0, {self.n_tags})")
        self._edges = np.arange(self.bins + 1, dtype=np.float64) / self.bins
        slots = self.bins + 1
        # [0] negatives, [1] positives; flat codes index the same memory.
        self._histogram = np.zeros((2, self.n_tags, slots), dtype=np.int32)
        self._flat = self._histogram.reshape(-1)
        self._tag_offsets = np.arange(self.n_tags, dtype=np.int64) * slots
        self._positive_offset = self.n_tags * slots
        self._tp = np.zeros(self.n_tags, dtype=np.int64)
        self._fp = np.zeros(self.n_tags, dtype=np.int64)
        self._fn = np.zeros(self.n_tags, dtype=np.int64)
        self.samples = 0
        self._loss_sum = 0.0
        self._loss_samples = 0

    def update(self, probabilities, labels, loss_sum=None) -> None:
        """Add one batch.

        probabilities: [batch, n_tags] sigmoid outputs in [0, 1] (not logits).
        labels: [batch, n_tags] multi-hot; a value >= 0.5 is a positive.
        loss_sum: the batch's loss summed over its samples (each sample's loss
        being its mean over tags, as Keras computes it); result()["loss"] is the
        mean per sample over the batches that supplied one.
        """
        scores = np.asarray(probabilities)
        truth = np.asarray(labels)
        if scores.ndim != 2 or scores.shape[1] != self.n_tags or truth.shape != scores.shape:
            raise ValueError(
                f"expected probabilities and labels of shape [batch, {self.n_tags}], "
                f"got {scores.shape} and {truth.shape}")
        batch = scores.shape[0]
        if batch == 0:
            return
        if self.samples + batch > MAX_SAMPLES:
            raise ValueError(f"more than {MAX_SAMPLES} validation samples")
        # float64 so comparisons against the bin edges match `score >= threshold`
        # done by a user on the same value.
        scores = scores.astype(np.float64, copy=False)
        if not np.isfinite(scores).all() or scores.min() < 0.0 or scores.max() > 1.0:
            raise ValueError("probabilities must be finite and in [0, 1] (pass sigmoid outputs, not logits)")
        positive = truth >= 0.5

        predicted = scores >= self.threshold
        self._tp += np.count_nonzero(predicted & positive, axis=0)
        self._fp += np.count_nonzero(predicted & ~positive, axis=0)
        self._fn += np.count_nonzero(~predicted & positive, axis=0)

        codes = self._slots(scores)
        codes += self._tag_offsets
        codes[positive] += self._positive_offset
        # Within one sample every tag has its own slot range, so a row's codes are
        # distinct and a fancy-indexed increment counts each once (np.add.at is
        # 3-6x slower: bench/metrics.py).
        for row in codes:
            self._flat[row] += 1

        self.samples += batch
        if loss_sum is not None:
            self._loss_sum += float(loss_sum)
            self._loss_samples += batch

    def _slots(self, scores: np.ndarray) -> np.ndarray:
        scaled = scores * self.bins
        slots = scaled.astype(np.int64)
        # The product can round across an edge only when it lies within a few ulps
        # of an integer; for those few the edges themselves decide, so a slot holds
        # exactly the scores with edges[k] <= score < edges[k + 1].
        near_edge = np.flatnonzero(np.abs(scaled - np.rint(scaled)) < _EDGE_MARGIN)
        if near_edge.size:
            flat, values = slots.reshape(-1), scores.reshape(-1)[near_edge]
            fixed = np.minimum(flat[near_edge], self.bins)
            fixed -= self._edges[fixed] > values
            fixed += (fixed < self.bins) & (self._edges[np.minimum(fixed + 1, self.bins)] <= values)
            flat[near_edge] = fixed
        return slots

    def result(self) -> dict:
        """Scalar metrics plus "per_tag" (numpy arrays of length n_tags, tags.txt order)."""
        tp, fp, fn = self._tp, self._fp, self._fn
        support = tp + fn
        has_positives = support > 0
        total_tp, total_fp, total_fn = int(tp.sum()), int(fp.sum()), int(fn.sum())
        total_tn = self.samples * self.n_tags - total_tp - total_fp - total_fn

        precision = ratios(tp, tp + fp)
        recall = ratios(tp, support)
        f1 = f1_scores(tp, fp, fn)

        def macro(values):
            return float(values[has_positives].mean()) if has_positives.any() else 0.0

        global_index, global_counts = self._global_threshold_index()
        if global_index is None:
            global_threshold = self.threshold
        else:
            global_threshold = float(self._edges[global_index])
        published = _PublishedFigures(self.n_tags, self.categories, self._edges)
        per_tag = self._per_tag_thresholds(published)


        loss = self._loss_sum / self._loss_samples if self._loss_samples else None
        return {
            "samples": self.samples,
            "tags": self.n_tags,
            "tags_with_positives": int(has_positives.sum()),
            "positives": total_tp + total_fn,
            "threshold": self.threshold,
            "bins": self.bins,
            "min_support": self.min_support,
            "loss": loss,
            "micro_precision": float(ratios(total_tp, total_tp + total_fp)),
            "micro_recall": float(ratios(total_tp, total_tp + total_fn)),
            "micro_f1": float(f1_scores(total_tp, total_fp, total_fn)),
            "macro_precision": macro(precision),
            "macro_recall": macro(recall),
            "macro_f1": macro(f1),
            "map": macro(per_tag["ap"]),
            "mcc": _mcc(total_tp, total_fp, total_fn, total_tn),
            "global_threshold": global_threshold,
            "global_threshold_precision": float(ratios(global_counts[0], global_counts[0] + global_counts[1])),
            "global_threshold_recall": float(ratios(global_counts[0], global_counts[0] + global_counts[2])),
            "global_threshold_f1": float(f1_scores(*global_counts)),
            "calibrated_tags": int(per_tag["calibrated"].sum()),
            "withheld_tags": int(per_tag["withheld"].sum()),
            "fallback_threshold": float(self._edges[self._fallback[0]]),
            "fallback_threshold_micro_f1": self._fallback[1],
            "fallback_threshold_micro_f1_at_threshold": self._fallback[2],
            "calibrated_macro_f1": macro(per_tag["f1"]),
            **_calibration_parts(per_tag, f1, has_positives),
            **published.result(),
            "per_tag": {**per_tag, "tp": tp.copy(), "fp": fp.copy(), "fn": fn.copy()},
        }

    def tag_curves(self, step: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(thresholds, precision, recall): each tag's curve at every `step`-th bin edge (exact counts there),
        [points] and [n_tags, points] float32; a tag without positives has recall 0 and precision 0 throughout."""
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        picked = np.arange(0, self.bins + 1, step)
        if picked[-1] != self.bins:
            picked = np.append(picked, self.bins)
        precision = np.empty((self.n_tags, picked.size), dtype=np.float32)
        recall = np.empty_like(precision)
        chunk = max(1, _RESULT_CHUNK_ELEMENTS // (self.bins + 1))
        for start in range(0, self.n_tags, chunk):
            stop = min(self.n_tags, start + chunk)
            tp = _tails(self._histogram[1, start:stop].astype(np.int64))
            fp = _tails(self._histogram[0, start:stop].astype(np.int64))
            support = tp[:, :1]
            precision[start:stop] = ratios(tp[:, picked], tp[:, picked] + fp[:, picked])
            recall[start:stop] = ratios(tp[:, picked], support)
        return self._edges[picked].astype(np.float32), precision, recall

    def _global_threshold_index(self):
        """Bin edge maximising pooled micro-F1 and its (tp, fp, fn); None without positives."""
        positives = _tails(self._histogram[1].sum(axis=0, dtype=np.int64))
        negatives = _tails(self._histogram[0].sum(axis=0, dtype=np.int64))
        total = int(positives[0])
        if total == 0:
            return None, (0, int(self._fp.sum()), 0)
        curve = f1_scores(positives, negatives, total - positives)
        index = int(best_threshold_indices(curve)[0])
        return index, (int(positives[index]), int(negatives[index]), total - int(positives[index]))

    def _per_tag_thresholds(self, published: "_PublishedFigures") -> dict:
        """Per-tag default thresholds, F1 and AP; feeds `published` the same chunks' curves (computed once).

        The policy (scoring.thresholds.ThresholdPolicy): a tag keeps its own F1-best threshold only where it is
        reliable; the others share the fallback threshold; a tag whose predictions at its threshold are mostly
        wrong, or that would land on most pictures without being that common, is withheld (never emitted).
        """
        n = self.n_tags
        policy = ThresholdPolicy(self.min_support)
        working = int(round(self.threshold * self.bins))
        out = {
            "threshold": np.empty(n, dtype=np.float64),
            "precision": np.empty(n, dtype=np.float64),
            "recall": np.empty(n, dtype=np.float64),
            "f1": np.empty(n, dtype=np.float64),
            "support": np.empty(n, dtype=np.int64),
            "ap": np.empty(n, dtype=np.float64),
            "calibrated": np.empty(n, dtype=bool),
            "withheld": np.zeros(n, dtype=bool),
            "predicted": np.zeros(n, dtype=np.int64),
        }
        own_index = np.zeros(n, dtype=np.int64)
        own_f1 = np.zeros(n)
        working_f1 = np.zeros(n)
        pooled_tp = np.zeros(self.bins + 1, dtype=np.int64)
        pooled_fp = np.zeros(self.bins + 1, dtype=np.int64)
        pooled_support = 0
        chunk = max(1, _RESULT_CHUNK_ELEMENTS // (self.bins + 1))
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            positives = self._histogram[1, start:stop].astype(np.int64)
            tp = _tails(positives)
            fp = _tails(self._histogram[0, start:stop].astype(np.int64))
            support = tp[:, 0]
            fn = support[:, None] - tp
            rows = np.arange(stop - start)

            # Average precision: precision at each slot's edge, weighted by the
            # positives that slot adds (scores inside a slot count as tied).
            precision_curve = ratios(tp, tp + fp)
            ap = ratios((positives * precision_curve).sum(axis=1), support)
            ap[support == 0] = np.nan

            f1_curve = f1_scores(tp, fp, fn)
            published.add(start, stop, tp, fp, fn, precision_curve, f1_curve)

            best = best_threshold_indices(f1_curve)
            part = slice(start, stop)
            own_index[part], own_f1[part], working_f1[part] = best, f1_curve[rows, best], f1_curve[:, working]
            own = policy.own_threshold(support, ap, own_f1[part], working_f1[part])
            pooled_tp += tp[~own].sum(axis=0)
            pooled_fp += fp[~own].sum(axis=0)
            pooled_support += int(support[~own].sum())
            out["support"][part], out["ap"][part], out["calibrated"][part] = support, ap, own

        # The tags without their own threshold share one: the micro-F1-best threshold over them, where it
        # measures better than the working threshold on them (otherwise the working threshold).
        pooled_f1 = f1_scores(pooled_tp, pooled_fp, pooled_support - pooled_tp)
        fallback = int(best_threshold_indices(pooled_f1)[0]) if pooled_support else working
        if not pooled_f1[fallback] > pooled_f1[working]:
            fallback = working
        self._fallback = (fallback, float(pooled_f1[fallback]), float(pooled_f1[working]))
        index = np.where(out["calibrated"], own_index, fallback)
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            part = slice(start, stop)
            rows = np.arange(stop - start)
            chosen_tp = _tails(self._histogram[1, part].astype(np.int64))[rows, index[part]]
            chosen_fp = _tails(self._histogram[0, part].astype(np.int64))[rows, index[part]]
            support = out["support"][part]
            chosen_fn = support - chosen_tp
            withheld = policy.withhold(chosen_tp, chosen_fp, support, self.samples)
            out["withheld"][part] = withheld
            out["threshold"][part] = np.where(out["calibrated"][part], self._edges[index[part]],
                                              self._edges[fallback])
            # What the default thresholds give: a withheld tag is never predicted.
            kept_tp, kept_fp = np.where(withheld, 0, chosen_tp), np.where(withheld, 0, chosen_fp)
            out["precision"][part] = ratios(kept_tp, kept_tp + kept_fp)
            out["recall"][part] = ratios(kept_tp, support)
            out["f1"][part] = f1_scores(kept_tp, kept_fp, np.where(withheld, support, chosen_fn))
            out["predicted"][part] = chosen_tp + chosen_fp
        out["own_f1"], out["working_f1"] = own_f1, working_f1
        out["reason"] = policy.reasons(out, self._edges[fallback], self.threshold, self.samples)
        return out


class _PublishedFigures:
    """The figures taggers publish, over all tags with positives and over each category's.

    For each group: the threshold where macro precision equals macro recall
    (bisection over the bin edges) with macro P, R and F1 there, and macro-F1
    and macro-MCC at FIXED_THRESHOLD (the nearest bin edge when it is not one).
    Fed chunk by chunk with the per-tag curves ValidationMetrics computes
    anyway, since those curves are the costly part.
    """

    def __init__(self, n_tags: int, categories: dict, edges: np.ndarray):
        self.prefixes = ["", *(f"{name}_" for name in categories)]
        self.members = np.zeros((len(self.prefixes), n_tags), dtype=bool)
        self.members[0] = True
        for row, indices in enumerate(categories.values(), start=1):
            self.members[row, indices] = True
        self.edges = edges
        self.fixed = int(round(FIXED_THRESHOLD * (len(edges) - 1)))
        slots, groups = len(edges), len(self.prefixes)
        self.sums = {name: np.zeros((groups, slots)) for name in ("precision", "recall", "f1")}
        self.mcc = np.zeros(groups)
        self.tags = np.zeros(groups)

    def add(self, start, stop, tp, fp, fn, precision, f1) -> None:
        support = tp[:, 0]
        curves = {"precision": precision, "recall": ratios(tp, support[:, None]), "f1": f1}
        k = self.fixed
        mcc = _mcc_values(tp[:, k], fp[:, k], fn[:, k], fp[:, 0] - fp[:, k])
        for row, member in enumerate(self.members[:, start:stop] & (support > 0)):
            for name, curve in curves.items():
                # A matrix product would do this in one call, but measured 10x slower on a busy 2-core host.
                self.sums[name][row] += curve[member].sum(axis=0)
            self.mcc[row] += mcc[member].sum()
            self.tags[row] += np.count_nonzero(member)

    def result(self) -> dict:
        out = {}
        for row, prefix in enumerate(self.prefixes):
            tags = int(self.tags[row])
            curves = {name: values[row] / max(tags, 1) for name, values in self.sums.items()}
            index = equal_point(curves["precision"], curves["recall"])
            out.update({
                f"{prefix}pr_tags": tags,
                f"{prefix}pr_threshold": float(self.edges[index]),
                f"{prefix}pr_precision": float(curves["precision"][index]),
                f"{prefix}pr_recall": float(curves["recall"][index]),
                f"{prefix}pr_f1": float(curves["f1"][index]),
                f"{prefix}macro_f1_040": float(curves["f1"][self.fixed]),
                f"{prefix}macro_mcc_040": float(self.mcc[row]) / tags if tags else 0.0,
            })
        return out


def _calibration_parts(per_tag: dict, f1_at_threshold: np.ndarray, has_positives: np.ndarray) -> dict:
    """calibrated_macro_f1 and macro_f1 average over the same tags (those with a positive), but a tag with
    fewer than min_support positives is not calibrated: it gets the global threshold, which frequent tags
    decide. Where most tags are that rare, calibrated_macro_f1 can fall below macro_f1. These figures split
    both averages into the two groups, each at the threshold the CSV gives and at the working threshold."""
    calibrated = per_tag["calibrated"] & has_positives
    fallback = has_positives & ~per_tag["calibrated"]

    def mean(values, mask):
        return float(values[mask].mean()) if mask.any() else 0.0

    return {
        "fallback_tags": int(fallback.sum()),
        "calibrated_tags_f1": mean(per_tag["f1"], calibrated),
        "calibrated_tags_f1_at_threshold": mean(f1_at_threshold, calibrated),
        "fallback_tags_f1": mean(per_tag["f1"], fallback),
        "fallback_tags_f1_at_threshold": mean(f1_at_threshold, fallback),
    }


def scalar_metrics(result: dict) -> dict:
    """The result without its per-tag arrays: what history, TensorBoard and metrics.json record."""
    return {key: value for key, value in result.items() if key != "per_tag"}


def is_improvement(metric: str, value, best) -> bool:
    """Whether `value` of `metric` beats `best` (None: nothing yet). Non-finite values never do."""
    if value is None or not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best if metric in LOWER_IS_BETTER else value > best


def _json_value(value):
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return [_json_value(item) for item in value.tolist()]
    if isinstance(value, dict):
        return {str(key): _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(item) for item in value]
    return value


# For other writers of metric files (best-model sidecar, history): numpy and non-finite values made JSON-safe.
json_ready = _json_value


def write_metrics_json(path, result: dict, extra: dict | None = None) -> None:
    """{**extra, "metrics": scalar metrics}; non-finite numbers are written as null."""
    payload = dict(extra or {})
    if "metrics" in payload:
        raise ValueError('extra must not have a "metrics" key')
    payload["metrics"] = scalar_metrics(result)
    text = json.dumps(_json_value(payload), indent=2, allow_nan=False)
    write_text_atomic(path, text + "\n")
