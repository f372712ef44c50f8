"""How long the audit's ranking takes: its own calibration (ranking.py, with and without the tag votes of
cooccurrence.py) against cleanlab's multi-label ranking in one process (what the audit used before), on the
same generated labels and scores.

Labels and scores are generated (Zipf-distributed tag frequencies, about 20 tags a post, a share of labels
flipped); TensorFlow is imported first, as in `deepdanbooru audit`. Each way ranks every label; the figure
beside each time is the share of the flipped labels among its first N (N = the flipped count).

    python bench/audit_ranking.py [--posts 5000] [--tags 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def generated(posts: int, tags: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    frequency = 1.0 / np.arange(1, tags + 1) ** 0.8
    frequency *= 20.0 / frequency.sum()
    truth = rng.random((posts, tags)) < np.minimum(frequency, 0.9)
    scores = np.clip(np.where(truth, rng.beta(5, 2, truth.shape), rng.beta(1, 12, truth.shape)), 0, 1)
    flips = rng.random(truth.shape) < 0.01 * truth.mean()
    return truth ^ flips, scores, flips


def own(given, scores, votes: bool):
    from deepdanbooru.audit.cooccurrence import tag_votes
    from deepdanbooru.audit.ranking import rank_labels

    started = time.perf_counter()
    tag_vote = tag_votes(given, list(range(given.shape[1]))) if votes else None
    order = rank_labels(given, scores, tag_vote).full_order()
    return time.perf_counter() - started, order


def cleanlab(given, scores):
    from cleanlab.multilabel_classification import rank as cl_rank

    labels = [np.flatnonzero(row).tolist() for row in given]
    started = time.perf_counter()
    quality = np.asarray(cl_rank.get_label_quality_scores_per_class(labels, scores, method="self_confidence",
                                                                    adjust_pred_probs=True))
    flat = np.argsort(quality, axis=None, kind="stable")
    return time.perf_counter() - started, np.stack(np.unravel_index(flat, quality.shape), axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=5000)
    parser.add_argument("--tags", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import tensorflow as tf  # noqa: F401  (the audit's process has it loaded when it ranks)

    given, scores, flips = generated(args.posts, args.tags)
    n = int(flips.sum())
    print(f"{args.posts:,} posts x {args.tags:,} tags, {int(given.sum()):,} labels, {n:,} flipped")
    ways = {"calibration, scores only": lambda: own(given, scores, False),
            "calibration, scores + tag votes": lambda: own(given, scores, True)}
    try:
        import cleanlab as _  # noqa: F401

        ways["cleanlab label quality (n_jobs=1)"] = lambda: cleanlab(given, scores)
    except ImportError:
        print("cleanlab is not installed: its row is left out")
    times = {name: [] for name in ways}
    found = {}
    for _ in range(args.rounds):
        for name, way in ways.items():
            seconds, order = way()
            times[name].append(seconds)
            found[name] = float(flips[order[:n, 0], order[:n, 1]].mean())
    fastest = min(min(values) for values in times.values())
    for name, values in times.items():
        print(f"{name:36s} best {min(values):7.2f} s ({min(values) / fastest:4.1f}x the fastest)  "
              f"precision of the first {n:,}: {found[name]:.3f}")


if __name__ == "__main__":
    main()
