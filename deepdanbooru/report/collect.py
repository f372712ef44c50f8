"""What the page shows of each picture and each tag, collected batch by batch (numpy only).

The figures themselves come from scoring.metrics.ValidationMetrics, fed the same batches; this keeps
what those histograms cannot give back:

- per picture, the scores of its caption's tags and of the `kept_negatives` highest-scoring tags it does
  not carry, enough to list its false positives and negatives at any thresholds (a picture whose kept
  negatives all pass their thresholds may have more, and says so);
- per tag, the `worst` highest-scoring pictures without it and the `worst` lowest-scoring pictures with it:
  the candidates for its worst false positives and false negatives.

Memory is O(pictures x (caption tags + kept_negatives) + tags x worst), never pictures x tags, so a
50,000-picture split over 10,000 tags fits (docs/evaluation.md has the measurement).
"""

from __future__ import annotations

import numpy as np

WORST = 3
KEPT_NEGATIVES = 16
# A negative scoring below this is never a false positive at a threshold the page would show.
NEGATIVE_FLOOR = 0.01


def _merge(scores, pictures, new_scores, new_pictures, keep: int, highest: bool):
    """Per column, the `keep` best of the running (scores, pictures) and the batch's candidates."""
    all_scores = np.concatenate([scores, new_scores], axis=0)
    all_pictures = np.concatenate([pictures, new_pictures], axis=0)
    key = -all_scores if highest else all_scores
    order = np.argsort(key, axis=0, kind="stable")[:keep]
    return np.take_along_axis(all_scores, order, axis=0), np.take_along_axis(all_pictures, order, axis=0)


def _batch_best(values, positions, keep: int, highest: bool):
    """Per column, the `keep` best rows of one batch (fewer rows: all of them)."""
    if values.shape[0] > keep:
        key = -values if highest else values
        rows = np.argpartition(key, keep - 1, axis=0)[:keep]
        return np.take_along_axis(values, rows, axis=0), positions[rows]
    return values, np.broadcast_to(positions[:, None], values.shape)


class PageCollector:
    def __init__(self, n_tags: int, worst: int = WORST, kept_negatives: int = KEPT_NEGATIVES):
        self.n_tags = int(n_tags)
        self.worst = int(worst)
        self.kept_negatives = min(int(kept_negatives), self.n_tags)
        # Running candidates; -1 pictures are empty slots (score -1 never outranks a real negative).
        self.fp_scores = np.full((self.worst, self.n_tags), -1.0, dtype=np.float32)
        self.fp_pictures = np.full((self.worst, self.n_tags), -1, dtype=np.int64)
        self.fn_scores = np.full((self.worst, self.n_tags), 2.0, dtype=np.float32)
        self.fn_pictures = np.full((self.worst, self.n_tags), -1, dtype=np.int64)
        self.positions: list[int] = []
        self.positive_tags: list[np.ndarray] = []
        self.positive_scores: list[np.ndarray] = []
        self.negative_tags: list[np.ndarray] = []
        self.negative_scores: list[np.ndarray] = []

    def update(self, scores, labels, positions) -> None:
        """scores, labels: [batch, n_tags]; positions: [batch] the pictures' indices in the split."""
        scores = np.asarray(scores, dtype=np.float32)
        positive = np.asarray(labels) >= 0.5
        positions = np.asarray(positions, dtype=np.int64)
        if scores.shape[0] == 0:
            return
        negatives = np.where(positive, np.float32(-1.0), scores)
        positives = np.where(positive, scores, np.float32(2.0))
        self.fp_scores, self.fp_pictures = _merge(self.fp_scores, self.fp_pictures,
                                                  *_batch_best(negatives, positions, self.worst, True),
                                                  self.worst, True)
        self.fn_scores, self.fn_pictures = _merge(self.fn_scores, self.fn_pictures,
                                                  *_batch_best(positives, positions, self.worst, False),
                                                  self.worst, False)
        keep = self.kept_negatives
        if keep < self.n_tags:
            top = np.argpartition(-negatives, keep - 1, axis=1)[:, :keep]
        else:
            top = np.broadcast_to(np.arange(self.n_tags), negatives.shape)
        for row in range(scores.shape[0]):
            tags = np.flatnonzero(positive[row])
            self.positions.append(int(positions[row]))
            self.positive_tags.append(tags.astype(np.int32))
            self.positive_scores.append(scores[row, tags].astype(np.float16))
            candidates = top[row]
            values = negatives[row, candidates]
            order = np.argsort(-values, kind="stable")
            candidates, values = candidates[order], values[order]
            kept = values >= NEGATIVE_FLOOR
            self.negative_tags.append(candidates[kept].astype(np.int32))
            self.negative_scores.append(values[kept].astype(np.float16))

    def tag_candidates(self, tag: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        """([(picture, score)] highest-scoring negatives, [(picture, score)] lowest-scoring positives)."""
        def pairs(pictures, scores):
            # Slots holding the stand-in scores (-1 for a positive, 2 for a negative, or empty) are left out.
            return [(int(p), float(s)) for p, s in zip(pictures[:, tag], scores[:, tag]) if p >= 0 and 0 <= s <= 1]
        return pairs(self.fp_pictures, self.fp_scores), pairs(self.fn_pictures, self.fn_scores)

    def picture_errors(self, index: int, thresholds: np.ndarray) -> dict:
        """One collected picture at per-tag thresholds: its tags, what was predicted, and the mistakes."""
        tags, scores = self.positive_tags[index], self.positive_scores[index].astype(np.float32)
        negative_tags, negative_scores = self.negative_tags[index], self.negative_scores[index].astype(np.float32)
        hit = scores >= thresholds[tags]
        false = negative_scores >= thresholds[negative_tags]
        # Every kept negative passed: one not kept may pass too.
        more = bool(len(negative_tags) == self.kept_negatives and false.all() and self.kept_negatives < self.n_tags)
        margin = float(np.sum(thresholds[tags][~hit] - scores[~hit]) +
                       np.sum(negative_scores[false] - thresholds[negative_tags][false]))
        return {
            "position": self.positions[index],
            "hits": [(int(t), float(s)) for t, s in zip(tags[hit], scores[hit])],
            "missed": [(int(t), float(s)) for t, s in zip(tags[~hit], scores[~hit])],
            "wrong": [(int(t), float(s)) for t, s in zip(negative_tags[false], negative_scores[false])],
            "more_wrong": more,
            "errors": int((~hit).sum() + false.sum()),
            "margin": margin,
        }

    def __len__(self) -> int:
        return len(self.positions)
