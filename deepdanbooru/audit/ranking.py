"""Which (post, tag) labels are likely wrong, from out-of-sample scores: confident learning.

cleanlab's multi-label methods do the work: each tag is its own two-class problem, the model's
score is set against the tag's confident thresholds (the mean score of the posts that carry it and
of those that do not), and a label's quality is the adjusted self-confidence in it. Its filter then
says how many labels confident learning counts as wrong (per tag, the off-diagonal of the confident
joint); that many labels, lowest quality first over all tags, are the suggestions.

cleanlab is licensed under the GNU AGPL v3, unlike this MIT package: it is the optional extra
`deepdanbooru[audit]`, imported only here, only by the audit command.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepdanbooru.errors import DependencyError, UserError

INSTALL = "pip install 'deepdanbooru[audit]'"


@dataclass(frozen=True)
class Ranking:
    quality: np.ndarray  # (posts, tags) float: lower is more likely a mistake
    flagged: np.ndarray  # (posts, tags) bool: the labels cleanlab's filter counts as wrong

    def order(self, limit: int | None = None) -> np.ndarray:
        """(post index, tag index) rows of the `limit` labels most likely a mistake (default: as many as
        confident learning counts wrong). The count is the filter's, the order the label quality's: on
        the measured case the lowest-quality labels held more of the injected errors than the set the
        filter flags, at the same count (docs/quality.md)."""
        count = int(self.flagged.sum()) if limit is None else limit
        return self.full_order()[:count]

    def full_order(self) -> np.ndarray:
        """Every (post, tag) pair, most likely a mistake first (what the benchmark measures top N of)."""
        flat = np.argsort(self.quality, axis=None, kind="stable")
        return np.stack(np.unravel_index(flat, self.quality.shape), axis=1)


def require_cleanlab():
    try:
        from cleanlab.multilabel_classification import filter as cl_filter, rank as cl_rank
    except ImportError:
        raise DependencyError(f"audit ranks labels with cleanlab (AGPL-3.0), an optional extra: {INSTALL}") from None
    return cl_filter, cl_rank


def rank_labels(given: np.ndarray, scores: np.ndarray) -> Ranking:
    """given: (posts, tags) 0/1 labels; scores: the same shape, out-of-sample probabilities."""
    given = np.asarray(given, dtype=bool)
    scores = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    in_use = np.flatnonzero(given.any(axis=0))
    if len(in_use) < 2:
        raise UserError("audit: the audited tags need at least two that some post carries "
                        f"({len(in_use)} carried); nothing to rank")
    cl_filter, cl_rank = require_cleanlab()
    labels = [np.flatnonzero(row).tolist() for row in given]
    quality = np.asarray(cl_rank.get_label_quality_scores_per_class(
        labels, scores, method="self_confidence", adjust_pred_probs=True), dtype=np.float64)
    # In this process: by default cleanlab starts a pool of worker processes for every tag, and each pool's start
    # (forking a process that holds TensorFlow and the scores) outweighs the tag's few sorts; the flagged labels
    # are the same either way (bench/audit_ranking.py: 25x faster at 2,000 posts x 300 tags on 2 cores).
    flagged = np.asarray(cl_filter.find_multilabel_issues_per_class(labels, scores, n_jobs=1), dtype=bool)
    if flagged.shape != given.shape:  # cleanlab answers (tags, posts) in some versions
        flagged = flagged.T
    return Ranking(quality=quality, flagged=flagged)
