"""ValidationMetrics.update: row-wise histogram increments (what it does) vs np.add.at.

Both variants bin the same scores; only the histogram scatter differs. Also
times result() on the filled accumulator. Prints ratios and a final JSON line.

    python bench/metrics.py [--tags 10000] [--bins 1000] [--batch 32] [--batches 20]
"""

import argparse
import json
import time

import numpy as np

from deepdanbooru.scoring.metrics import ValidationMetrics


class _AddAtMetrics(ValidationMetrics):
    """The same accumulator with np.add.at as the scatter, for comparison only."""

    def update(self, probabilities, labels, loss_sum=None):
        scores = np.asarray(probabilities, dtype=np.float64)
        positive = np.asarray(labels) >= 0.5
        predicted = scores >= self.threshold
        self._tp += np.count_nonzero(predicted & positive, axis=0)
        self._fp += np.count_nonzero(predicted & ~positive, axis=0)
        self._fn += np.count_nonzero(~predicted & positive, axis=0)
        codes = self._slots(scores) + self._tag_offsets + positive * self._positive_offset
        np.add.at(self._flat, codes.ravel(), 1)
        self.samples += scores.shape[0]


def _time_updates(metrics, batches):
    start = time.perf_counter()
    for scores, labels in batches:
        metrics.update(scores, labels)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tags", type=int, default=10000)
    parser.add_argument("--bins", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    batches = [(rng.random((args.batch, args.tags), dtype=np.float32),
                rng.random((args.batch, args.tags)) < 0.01) for _ in range(args.batches)]
    rowwise = ValidationMetrics(args.tags, bins=args.bins)
    add_at = _AddAtMetrics(args.tags, bins=args.bins)
    rowwise_s = _time_updates(rowwise, batches)
    add_at_s = _time_updates(add_at, batches)
    assert np.array_equal(rowwise._histogram, add_at._histogram)

    start = time.perf_counter()
    rowwise.result()
    result_s = time.perf_counter() - start

    samples = args.batch * args.batches
    figures = {
        "tags": args.tags,
        "bins": args.bins,
        "batch": args.batch,
        "samples": samples,
        "histogram_mb": rowwise._histogram.nbytes / 2**20,
        "rowwise_update_ms_per_batch": 1000 * rowwise_s / args.batches,
        "add_at_update_ms_per_batch": 1000 * add_at_s / args.batches,
        "rowwise_samples_per_s": samples / rowwise_s,
        "add_at_samples_per_s": samples / add_at_s,
        "speedup_rowwise_over_add_at": add_at_s / rowwise_s,
        "result_s": result_s,
    }
    print(f"update, row-wise increments: {figures['rowwise_update_ms_per_batch']:.1f} ms/batch "
          f"({figures['rowwise_samples_per_s']:.0f} samples/s)")
    print(f"update, np.add.at:           {figures['add_at_update_ms_per_batch']:.1f} ms/batch "
          f"({figures['add_at_samples_per_s']:.0f} samples/s)")
    print(f"row-wise is {figures['speedup_rowwise_over_add_at']:.1f}x faster; "
          f"result() {result_s:.2f} s; histograms {figures['histogram_mb']:.0f} MiB")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
