"""What the console's training metrics cost, and what a validation pass costs, side by side in one run.

    python bench/metrics_overhead.py [--model resnet_small] [--size 64] [--batch 32] [--tags 100,5000]
                                     [--steps 8] [--rounds 3]

Per tag count, three train steps on the same in-memory batch, each with its
own model and optimizer (same seed), timed in interleaved rounds (the order
rotating each round) so drift in the machine's load hits all three alike:

- none:   deepdanbooru.training.step.TrainStep(count_metrics=False): loss and sample counts only;
- counts: the trainer's step: tp / fp / fn at 0.5 accumulated in-graph, read on the host only at console lines;
- sync:   the same step plus a host read of the loss after every step (what a per-step Python metric costs).

The three-way comparison is only as good as the machine is quiet; the cost
of the counting ops themselves is also timed in isolation: the step's own
threshold_counts on a [batch, tags] score matrix, repeated 200 times inside
one graph (so no per-call overhead counts; each repetition also perturbs the
scores once, so the figure is an upper bound), as a share of the step.

Also: validation throughput (scoring.scorer.BatchScorer plus
ValidationMetrics.update on the host, i.e. everything after decoding) against
the training step's.

Reported per variant, from the least disturbed block (the minimum: other
processes on a shared machine only ever add time): wall seconds per step and
CPU seconds per step (time.process_time: all threads of this process, so
other processes' load does not count). Ratios counts/none and sync/none
(1.0 = free) of both, and validation samples/s over training samples/s (CPU).
On a CPU the step runs synchronously, so `sync` can only show its cost in
wall time on an accelerator. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _variant(model_name, size, n_tags, count_metrics):
    import keras
    import tensorflow as tf

    from deepdanbooru.models import build_model, make_optimizer
    from deepdanbooru.training.step import TrainStep

    keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = build_model(model_name, (size, size, 3), n_tags, seed=0)
        optimizer = make_optimizer("adam", 0.001)
        optimizer.build(model.trainable_variables)
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False,
                     count_metrics=count_metrics)
    return model, step


def _batch(size, batch, n_tags):
    import numpy as np

    rng = np.random.default_rng(0)
    return {"image": rng.random((batch, size, size, 3), dtype=np.float32),
            "label": (rng.random((batch, n_tags)) < 0.05).astype(np.float32),
            "position": np.arange(batch, dtype=np.int64)}


def measure_tags(args, n_tags: int) -> dict:
    import tensorflow as tf

    from deepdanbooru.scoring.metrics import ValidationMetrics
    from deepdanbooru.scoring.scorer import BatchScorer

    element = _batch(args.size, args.batch, n_tags)
    strategy = tf.distribute.get_strategy()
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(element).repeat().prefetch(2))
    variants = {"none": _variant(args.model, args.size, n_tags, False),
                "counts": _variant(args.model, args.size, n_tags, True)}
    variants["sync"] = variants["counts"]  # same step; only the host reads differ
    iterator = iter(dataset)
    for _, step in variants.values():
        step.bind(dataset.element_spec)
        for _ in range(2):
            step(next(iterator))
        step.sums.read_window()

    wall = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names[round_ % 3:] + names[:round_ % 3]:
            step = variants[name][1]
            begin, begin_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step(next(iterator))
                if name == "sync":
                    float(step.sums.loss_sum.numpy())
            step.sums.read_window()  # waits for the last step
            wall[name].append((time.perf_counter() - begin) / args.steps)
            cpu[name].append((time.process_time() - begin_cpu) / args.steps)

    model = variants["counts"][0]
    scorer = BatchScorer(model, "binary_crossentropy", args.size, args.size)
    images, labels = tf.constant(element["image"]), tf.constant(element["label"])
    scorer(images, labels)
    for _ in range(args.rounds):
        metrics = ValidationMetrics(n_tags)
        begin, begin_cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            scores, loss_sum = scorer(images, labels)
            metrics.update(scores, element["label"], loss_sum)
        wall.setdefault("validation", []).append((time.perf_counter() - begin) / args.steps)
        cpu.setdefault("validation", []).append((time.process_time() - begin_cpu) / args.steps)

    from deepdanbooru.training.step import threshold_counts

    repetitions = 200

    @tf.function
    def counting(scores, labels):
        total = tf.zeros([], tf.float64)
        for i in tf.range(repetitions):
            # The perturbation keeps the repetitions from being folded into one.
            tp, fp, fn = threshold_counts(scores + tf.cast(i, tf.float32) * 1e-9, labels)
            total += tp + fp + fn
        return total

    scores = tf.random.stateless_uniform((args.batch, n_tags), seed=[0, 1])
    float(counting(scores, labels))
    counts_op = []
    for _ in range(args.rounds):
        begin = time.perf_counter()
        float(counting(scores, labels))
        counts_op.append((time.perf_counter() - begin) / repetitions)
    counts_op = min(counts_op)

    wall = {name: min(values) for name, values in wall.items()}
    cpu = {name: min(values) for name, values in cpu.items()}
    return {
        "tags": n_tags,
        "wall_seconds_per_step": wall,
        "cpu_seconds_per_step": cpu,
        "counts_over_none": {"wall": wall["counts"] / wall["none"], "cpu": cpu["counts"] / cpu["none"]},
        "sync_over_none": {"wall": wall["sync"] / wall["none"], "cpu": cpu["sync"] / cpu["none"]},
        "validation_over_training_samples_per_second": cpu["counts"] / cpu["validation"],
        "counting_ops_seconds": counts_op,
        "counting_ops_share_of_step": counts_op / wall["none"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet_small")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tags", default="100,5000", help="comma-separated tag counts")
    parser.add_argument("--steps", type=int, default=8, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved blocks per variant")
    args = parser.parse_args()

    import tensorflow as tf

    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    results = [measure_tags(args, int(n)) for n in args.tags.split(",")]
    print(f"{args.model} {args.size}x{args.size}, batch {args.batch}, {device}; fastest of {args.rounds} blocks "
          f"of {args.steps} steps")
    print(f"{'tags':>6} {'clock':>5} {'none s/step':>12} {'counts':>8} {'sync':>8} {'counts/none':>12} "
          f"{'sync/none':>10}")
    for r in results:
        for clock in ("wall", "cpu"):
            s = r[f"{clock}_seconds_per_step"]
            print(f"{r['tags']:>6} {clock:>5} {s['none']:>12.4f} {s['counts']:>8.4f} {s['sync']:>8.4f} "
                  f"{r['counts_over_none'][clock]:>12.3f} {r['sync_over_none'][clock]:>10.3f}")
        print(f"{r['tags']:>6} counting ops alone: {1e6 * r['counting_ops_seconds']:.0f} us per step = "
              f"{100 * r['counting_ops_share_of_step']:.3f}% of a step")
        print(f"{r['tags']:>6} validation samples/s over training samples/s (cpu): "
              f"{r['validation_over_training_samples_per_second']:.2f}")
    print(json.dumps({"model": args.model, "size": args.size, "batch": args.batch, "device": device,
                      "results": results}))


if __name__ == "__main__":
    main()
