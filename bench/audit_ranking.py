"""How long the audit's ranking takes: cleanlab's per-tag filter in worker processes (its default) or in this one.

cleanlab's `find_multilabel_issues_per_class` treats each tag as a two-class problem and, unless told
`n_jobs`, starts a multiprocessing pool of one process per physical core for every tag. The work per
tag is small (a few sorts of one column), so the pools' start-up can outweigh it; the audit's process
also holds TensorFlow and the scores, which every fork copies. Both ways run here, side by side, on the
same generated labels and scores (Zipf-distributed tag frequencies, about 20 tags a post, with a share of
labels flipped), with TensorFlow imported first as in `deepdanbooru audit`; the flagged labels must be
identical.

    python bench/audit_ranking.py [--posts 5000] [--tags 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def generated(posts: int, tags: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    frequency = 1.0 / np.arange(1, tags + 1) ** 0.8
    frequency *= 20.0 / frequency.sum()
    truth = rng.random((posts, tags)) < np.minimum(frequency, 0.9)
    scores = np.clip(np.where(truth, rng.beta(5, 2, truth.shape), rng.beta(1, 12, truth.shape)), 0, 1)
    given = truth ^ (rng.random(truth.shape) < 0.01 * truth.mean())
    return given, scores


def ranked(given, scores, processes: int | None) -> tuple[float, np.ndarray]:
    from cleanlab.multilabel_classification import filter as cl_filter

    labels = [np.flatnonzero(row).tolist() for row in given]
    started = time.perf_counter()
    flagged = cl_filter.find_multilabel_issues_per_class(labels, scores, n_jobs=processes)
    return time.perf_counter() - started, np.asarray(flagged, dtype=bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=5000)
    parser.add_argument("--tags", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import tensorflow as tf  # noqa: F401  (the audit's process has it loaded when it ranks)

    given, scores = generated(args.posts, args.tags)
    print(f"{args.posts:,} posts x {args.tags:,} tags, {int(given.sum()):,} labels")
    times = {"pools (cleanlab's default)": [], "one process (n_jobs=1)": []}
    answers = {}
    for _ in range(args.rounds):
        for name, processes in zip(times, (None, 1)):
            seconds, flagged = ranked(given, scores, processes)
            times[name].append(seconds)
            answers.setdefault(name, flagged)
            assert np.array_equal(answers[name], flagged)
    same = np.array_equal(*answers.values())
    for name, values in times.items():
        print(f"{name:28s} best {min(values):7.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    slow, fast = (min(values) for values in times.values())
    print(f"ratio: one process is {slow / fast:.1f}x faster; flagged labels identical: {same} "
          f"({int(answers['one process (n_jobs=1)'].sum()):,} flagged)")


if __name__ == "__main__":
    main()
