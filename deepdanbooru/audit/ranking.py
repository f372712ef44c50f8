"""Which (post, tag) labels are likely wrong: each label's probability of being a mistake, per tag.

The out-of-sample scores are calibrated tag by tag on the posts themselves (numpy only):

1. Separation. A tag's AUC (how often a carrier outscores a post without the tag) says whether its
   scores tell carriers from the rest at all. A tag with fewer than MIN_CARRIERS carriers, or an AUC
   under MIN_AUC, is not audited: its scores cannot separate, and every "suggestion" on it would be noise.
2. Calibration (Platt-style). For each audited tag, P(given | score) = sigmoid(a * logit(score) + b),
   fitted by maximum a posteriori with a Gaussian prior that pulls the slope a to 0 and b to the tag's
   frequency: a tag with few carriers or weak separation keeps a flat fit, so its likelihood ratios stay
   near 1 and its labels near the prior. The fit's odds over the tag's prior odds are the likelihood
   ratio LR(score) = p(score | carrier) / p(score | not a carrier).
3. Noise. Two rates for all audited tags: `missing`, the share of the posts that show a tag which lack
   it, and `wrong`, the share of a tag's carriers that do not show it. The probability that a label is
   wrong is then Bayes' rule with the label's prior odds of being wrong:
       missing (given 0): odds = prior_missing(tag) * LR(score),   prior_missing = m / (1 - m) * carriers / others
       wrong (given 1):   odds = prior_wrong / LR(score),          prior_wrong = w / (1 - w)
   and the rates are those under which the expected mistakes match (an EM fixed point over all labels:
   expected missing labels / (carriers + expected missing), expected wrong labels / carriers).
   The sum of all probabilities is the estimated number of label errors.

Rows are ranked by that probability; the default list keeps those at 0.5 or more, and no more than the
estimated number of errors (docs/audit.md; measured in docs/quality.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepdanbooru.errors import UserError

MIN_CARRIERS = 3  # fewer: no separation can be measured, nor a calibration fitted
MIN_AUC = 0.75  # below: the tag's scores do not separate its carriers well enough to audit it
DEFAULT_MIN_PROBABILITY = 0.5
SLOPE_PRIOR, OFFSET_PRIOR = 0.1, 1.0  # the Gaussian prior's precisions: a slope of a few units is plausible
START_RATE, RATE_ROUNDS = 0.03, 50
TAG_RATE_LABELS = 50.0  # how many labels' worth the rates over all tags weigh in each tag's own
RATE_PRIOR_LABELS = 30.0  # the rates' Beta prior: START_RATE over this many labels (keeps small projects off 0)
EPSILON = 1e-4
MAX_STEP = 1.0  # the largest change of one weight in one Newton step
CONVERGED = 1e-4  # the EM stops when no label's probability moves more than this in a round


@dataclass(frozen=True)
class Ranking:
    probability: np.ndarray  # (posts, tags): estimated probability that the given label is wrong; 0 if not audited
    audited: np.ndarray  # (tags,) bool: the tags whose scores separate (the others have no rows)
    auc: np.ndarray  # (tags,) the scores' AUC against the given labels; NaN where a class is empty
    carriers: np.ndarray  # (tags,) posts carrying the tag
    rates: dict  # {"missing": m, "wrong": w} as estimated

    @property
    def estimated_errors(self) -> float:
        return float(self.probability.sum())

    def full_order(self) -> np.ndarray:
        """Every (post, tag) pair of an audited tag, most likely a mistake first."""
        masked = np.where(self.audited[None, :], self.probability, -1.0)
        flat = np.argsort(-masked, axis=None, kind="stable")[:int(self.audited.sum()) * masked.shape[0]]
        return np.stack(np.unravel_index(flat, masked.shape), axis=1)

    def order(self, top: int | None = None, min_probability: float | None = None) -> np.ndarray:
        """The rows of the list: by default those at DEFAULT_MIN_PROBABILITY or more, no more than the estimated
        number of errors; --top N caps the count at N instead (no floor unless --min-probability), and
        --min-probability P sets the floor (no cap unless --top)."""
        if top is None and min_probability is None:
            top, min_probability = int(round(self.estimated_errors)), DEFAULT_MIN_PROBABILITY
        elif min_probability is None:
            min_probability = 0.0
        rows = self.full_order()
        keep = self.probability[rows[:, 0], rows[:, 1]] >= min_probability
        rows = rows[keep]
        return rows if top is None else rows[:top]


def tag_auc(given: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Per column: P(a carrier's score > a non-carrier's), ties half; NaN where either class is empty."""
    given = np.asarray(given, dtype=bool)
    ranks = _average_ranks(scores)
    carriers = given.sum(axis=0).astype(np.float64)
    others = given.shape[0] - carriers
    rank_sum = np.where(given, ranks, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (rank_sum - carriers * (carriers + 1) / 2) / (carriers * others)
    return np.where((carriers > 0) & (others > 0), auc, np.nan)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks down each column, tied values sharing their mean rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, axis=0, kind="stable")
    ranks = np.empty_like(values)
    for column in range(values.shape[1]):
        sorted_values = values[order[:, column], column]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_values)) + 1]
        ends = np.r_[starts[1:], len(sorted_values)]
        mean_rank = (starts + ends + 1) / 2.0
        ranks[order[:, column], column] = np.repeat(mean_rank, ends - starts)
    return ranks


def fit_platt(targets: np.ndarray, features: np.ndarray, start=None, rounds: int = 30) -> np.ndarray:
    """Per column the weights w of P(carrier | features) = sigmoid(w[:-1] . features + w[-1]), fitted to
    `targets` (posts, tags; 0..1: a label, or the probability that the picture shows the tag) by maximum a
    posteriori under a Gaussian prior (precisions SLOPE_PRIOR on the slopes, OFFSET_PRIOR on the offset)
    centred on slopes 0 and the logit of the column's mean target; Newton's method on all columns at once,
    from `start` (tags, k + 1) when given. features: (posts, tags, k), e.g. logits of scores."""
    y = np.asarray(targets, dtype=np.float64)
    x = [features[:, :, index] for index in range(features.shape[2])] + [None]  # None: the offset's 1
    k = len(x)
    frequency = np.clip((y.sum(axis=0) + 0.5) / (y.shape[0] + 1.0), EPSILON, 1 - EPSILON)
    centre = np.zeros((y.shape[1], k))
    centre[:, -1] = np.log(frequency / (1 - frequency))
    precision = np.full(k, SLOPE_PRIOR)
    precision[-1] = OFFSET_PRIOR
    w = centre.copy() if start is None else np.array(start, dtype=np.float64)
    for _ in range(rounds):
        linear = w[:, -1] + sum(x[index] * w[:, index] for index in range(k - 1))
        p = _sigmoid(linear)
        weight, residual = p * (1 - p), p - y
        gradient = np.stack([_moment(residual, x[a]) for a in range(k)], axis=1) + precision * (w - centre)
        hessian = np.empty((y.shape[1], k, k))
        for a in range(k):
            for b in range(a, k):
                hessian[:, a, b] = hessian[:, b, a] = _moment(weight, x[a], x[b])
        hessian += np.diag(precision)
        step = np.linalg.solve(hessian, gradient[..., None])[..., 0]
        # A bounded step: near-separable columns (a tag the features all but decide) would otherwise send
        # Newton's full step far out, where the fit and the EM around it do not come back from.
        step = np.clip(np.nan_to_num(step), -MAX_STEP, MAX_STEP)
        w = w - step
        if np.abs(step).max(initial=0.0) < 1e-6:
            break
    return w


def _moment(values, first, second=None) -> np.ndarray:
    """Per column: the sum of values * first * second (None: 1)."""
    if first is not None:
        values = values * first
    if second is not None:
        values = values * second
    return values.sum(axis=0)


def rank_labels(given: np.ndarray, scores: np.ndarray, votes: np.ndarray | None = None) -> Ranking:
    """given: (posts, tags) 0/1 labels; scores: the same shape, out-of-sample probabilities; votes: the same
    shape, what the post's other tags say of each tag (cooccurrence.tag_votes), or None to rank on the
    scores alone."""
    given = np.asarray(given, dtype=bool)
    scores = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    posts = given.shape[0]
    carriers = given.sum(axis=0)
    if int((carriers > 0).sum()) < 1:
        raise UserError("audit: no post carries any of the audited tags; nothing to rank")
    auc = tag_auc(given, scores)
    audited = (carriers >= MIN_CARRIERS) & (posts - carriers >= MIN_CARRIERS) & (np.nan_to_num(auc) >= MIN_AUC)
    probability = np.zeros(given.shape, dtype=np.float64)
    rates = {"missing": 0.0, "wrong": 0.0}
    if audited.any():
        features = [_logit(scores[:, audited])]
        if votes is not None:
            features.append(_logit(np.asarray(votes, dtype=np.float64)[:, audited]))
        probability[:, audited], rates = _noisy_calibration(given[:, audited], np.stack(features, axis=2))
    return Ranking(probability=probability, audited=audited, auc=auc, carriers=carriers, rates=rates)


def _noisy_calibration(given: np.ndarray, features: np.ndarray) -> tuple[np.ndarray, dict]:
    """EM over the unseen true labels: P(shows the tag | features) = the Platt fit to the current beliefs; a
    picture that shows the tag lacks it at the tag's `missing` rate, one that does not carries it at the
    rate that makes the tag's `wrong` rate the share of its carriers that are mistakes. Each tag's rates
    are its own expected mistakes pulled towards the rates over all tags by TAG_RATE_LABELS labels' worth
    (few carriers, little of its own say); those towards START_RATE by RATE_PRIOR_LABELS. Returns each
    label's probability of being wrong and the rates over all tags."""
    carriers = given.sum(axis=0).astype(np.float64)
    others = given.shape[0] - carriers
    missing_all = wrong_all = START_RATE
    missing = np.full(given.shape[1], START_RATE)
    wrong = np.full(given.shape[1], START_RATE)
    prior_errors = START_RATE * RATE_PRIOR_LABELS
    # The first beliefs take the model's scores as they are (slope 1 on the score's logit, every other
    # weight 0): a model trained on the labels with a logistic loss scores near their frequency, and a first
    # fit to the labels themselves would bend to the mistakes it is meant to find.
    fit = np.zeros((given.shape[1], features.shape[2] + 1))
    fit[:, 0] = 1.0
    previous = None
    for round_ in range(RATE_ROUNDS):
        if round_:
            fit = fit_platt(shows, features, start=fit, rounds=2)
        clean = np.clip(_sigmoid(np.einsum("ptk,tk->pt", features, fit[:, :-1]) + fit[:, -1]), EPSILON, 1 - EPSILON)
        added = np.clip(wrong * carriers / np.maximum(others, 1.0), EPSILON, 0.5)  # P(carried | not shown)
        kept = (1 - missing) * clean
        shows_given = kept / (kept + added * (1 - clean))
        lost = missing * clean
        shows_lacking = lost / (lost + (1 - added) * (1 - clean))
        shows = np.where(given, shows_given, shows_lacking)
        expected_missing = np.where(given, 0.0, shows).sum(axis=0)
        expected_wrong = np.where(given, 1 - shows, 0.0).sum(axis=0)
        true_carriers = shows.sum(axis=0)
        missing_all = (expected_missing.sum() + prior_errors) / (true_carriers.sum() + RATE_PRIOR_LABELS)
        wrong_all = (expected_wrong.sum() + prior_errors) / (carriers.sum() + RATE_PRIOR_LABELS)
        missing = np.clip((expected_missing + TAG_RATE_LABELS * missing_all) / (true_carriers + TAG_RATE_LABELS),
                          EPSILON, 0.5)
        wrong = np.clip((expected_wrong + TAG_RATE_LABELS * wrong_all) / (carriers + TAG_RATE_LABELS), EPSILON, 0.5)
        if previous is not None and np.abs(shows - previous).max() < CONVERGED:
            break
        previous = shows
    probability = np.where(given, 1 - shows, shows)
    return probability, {"missing": float(missing_all), "wrong": float(wrong_all)}


def _logit(values) -> np.ndarray:
    values = np.clip(np.asarray(values, dtype=np.float64), EPSILON, 1 - EPSILON)
    return np.log(values / (1 - values))


def _sigmoid(values) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(values, dtype=np.float64)))
