"""What the audit says about its own models and the labels: each scoring model's validation figures on
the posts it did not see, the tags it could not audit, the estimated number of label errors, and a plain
warning when the models are too weak for their suggestions to mean much (numpy only)."""

from __future__ import annotations

import numpy as np

from deepdanbooru.audit.ranking import MIN_AUC, MIN_CARRIERS, tag_auc
from deepdanbooru.wording import plural

# A model whose out-of-sample scores separate (AUC at ranking.MIN_AUC or more) fewer than this share of the
# tags it could be judged on is called too weak: most of its suggestions would come from tags it does not
# know. mAP is shown but not judged by: over many rare tags it stays low even where the common tags, which
# hold most mistakes, are well known (docs/quality.md: emoji folds of mAP 0.28-0.33 whose first 100 rows
# held 99 injected mistakes).
WEAK_SHARE = 0.5
NAMED_SKIPPED = 10  # the summary line names this many skipped tags; audit.json holds them all


def average_precision(given: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per column: the mean precision at each carrier's rank (scores descending); NaN without a carrier."""
    given = np.asarray(given, dtype=bool)
    order = np.argsort(-np.asarray(scores, dtype=np.float64), axis=0, kind="stable")
    hits = np.take_along_axis(given, order, axis=0)
    cumulative = np.cumsum(hits, axis=0)
    precision = cumulative / np.arange(1, given.shape[0] + 1)[:, None]
    carriers = given.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(carriers > 0, (precision * hits).sum(axis=0) / carriers, np.nan)


def validation_figures(name: str, given: np.ndarray, scores: np.ndarray) -> dict:
    """One model's figures on the posts it scored, against their labels as given (mistakes included)."""
    ap = average_precision(given, scores)
    auc = tag_auc(given, scores)
    carriers = np.asarray(given, dtype=bool).sum(axis=0)
    judged = (carriers >= MIN_CARRIERS) & (given.shape[0] - carriers >= MIN_CARRIERS)
    return {"model": name, "posts": int(given.shape[0]), "tags_with_carriers": int(np.isfinite(ap).sum()),
            "map": _mean(ap), "mean_auc": _mean(auc), "tags_judged": int(judged.sum()),
            "tags_separated": int((judged & (np.nan_to_num(auc) >= MIN_AUC)).sum())}


def _mean(values) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return round(float(values.mean()), 4) if len(values) else None


def too_weak(validation: list[dict]) -> str | None:
    """The warning, when a scoring model separates fewer than WEAK_SHARE of the tags it is judged on."""
    weak = [figures for figures in validation
            if figures["tags_separated"] < WEAK_SHARE * figures["tags_judged"] or not figures["tags_judged"]]
    if not weak:
        return None
    named = "; ".join(f"{figures['model']} separates {figures['tags_separated']:,} of the {figures['tags_judged']:,} "
                      f"tags it can be judged on (mAP {figures['map']}, mean AUC {figures['mean_auc']})"
                      for figures in weak)
    return (f"the scoring models are too weak for their suggestions to mean much: on the posts they did not see, "
            f"{named}, where separating means an AUC of {MIN_AUC} or more over {MIN_CARRIERS} or more carriers; "
            "only rows with a high probability are worth a look, and a better model (longer --time-limit, a "
            "stronger --model-path) will find more")


def skipped_tags(ranking, tags: list[str]) -> list[dict]:
    """The tags not audited, with their figure: too few carriers or posts without the tag (`without`), or an AUC
    under MIN_AUC."""
    skipped = []
    posts = ranking.probability.shape[0]
    for column in np.flatnonzero(~ranking.audited):
        carriers = int(ranking.carriers[column])
        auc = ranking.auc[column]
        skipped.append({"tag": tags[column], "carriers": carriers, "without": posts - carriers,
                        "auc": None if not np.isfinite(auc) else round(float(auc), 3)})
    # Those with a figure first, least separable first; then the tags too few posts carry.
    return sorted(skipped, key=lambda item: (item["auc"] is None, item["auc"] or 0.0, item["carriers"], item["tag"]))


def skipped_line(skipped: list[dict]) -> str | None:
    if not skipped:
        return None
    shown = []
    for item in skipped[:NAMED_SKIPPED]:
        # A tag nearly every post carries may separate well: it is skipped for the few posts without it.
        without = item.get("without")  # absent in an audit.json from before it was recorded
        if item["carriers"] >= MIN_CARRIERS and without is not None and without < MIN_CARRIERS:
            figure = f"{plural(without, 'post')} without it"
        elif item["carriers"] >= MIN_CARRIERS and item["auc"] is not None:
            figure = f"AUC {item['auc']:.2f}"
        else:
            figure = plural(item["carriers"], "carrier")
        shown.append(f"{item['tag']} ({figure})")
    more = f" and {len(skipped) - NAMED_SKIPPED:,} more (audit.json)" if len(skipped) > NAMED_SKIPPED else ""
    return (f"Not audited: {plural(len(skipped), 'tag')} whose out-of-sample scores cannot separate their carriers "
            f"from the rest (AUC under {MIN_AUC}, or fewer than {MIN_CARRIERS} carriers or non-carriers): "
            f"{', '.join(shown)}{more}")
