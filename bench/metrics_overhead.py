"""What the console's training metrics cost, and what a validation pass costs, side by side in one run.

    python bench/metrics_overhead.py [--model resnet_small] [--size 64] [--batch 32] [--tags 100,5000]
                                     [--steps 8] [--rounds 3]

Per tag count, three train steps on the same in-memory batch, each with its
own model and optimizer (same seed), timed in interleaved rounds (the order
rotating each round) so drift in the machine's load hits all three alike:

- none:   deepdanbooru.training.step.TrainStep(count_metrics=False): loss and sample counts only;
- counts: the trainer's step: tp / fp / fn at 0.5 accumulated in-graph, read on the host only at console lines;
- sync:   the same step plus a host read of the loss after every step (what a per-step Python metric costs).

Also: validation throughput (training.validation.BatchScorer plus
ValidationMetrics.update on the host, i.e. everything after decoding) against
the training step's.

Reported: the fastest block's seconds per step of each (on a shared machine
other processes only ever add time, so the minimum is the least disturbed
figure); ratios counts/none and sync/none (1.0 = free); validation samples/s
over training samples/s. Last line: JSON.
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

    from deepdanbooru.training.metrics import ValidationMetrics
    from deepdanbooru.training.validation import BatchScorer

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
        step.counters.read_window()

    timings = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names[round_ % 3:] + names[:round_ % 3]:
            step = variants[name][1]
            begin = time.perf_counter()
            for _ in range(args.steps):
                step(next(iterator))
                if name == "sync":
                    float(step.counters.loss_sum.numpy())
            step.counters.read_window()  # waits for the last step
            timings[name].append((time.perf_counter() - begin) / args.steps)

    model = variants["counts"][0]
    scorer = BatchScorer(model, "binary_crossentropy", args.size, args.size)
    images, labels = tf.constant(element["image"]), tf.constant(element["label"])
    scorer(images, labels)
    validation = []
    for _ in range(args.rounds):
        metrics = ValidationMetrics(n_tags)
        begin = time.perf_counter()
        for _ in range(args.steps):
            scores, loss_sum = scorer(images, labels)
            metrics.update(scores, element["label"], loss_sum)
        validation.append((time.perf_counter() - begin) / args.steps)

    seconds = {name: min(values) for name, values in timings.items()}
    seconds["validation"] = min(validation)
    return {
        "tags": n_tags,
        "seconds_per_step": seconds,
        "counts_over_none": seconds["counts"] / seconds["none"],
        "sync_over_none": seconds["sync"] / seconds["none"],
        "validation_over_training_samples_per_second": seconds["counts"] / seconds["validation"],
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
    print(f"{'tags':>6} {'none s/step':>12} {'counts':>8} {'sync':>8} {'counts/none':>12} {'sync/none':>10} "
          f"{'validation/training samples/s':>30}")
    for r in results:
        s = r["seconds_per_step"]
        print(f"{r['tags']:>6} {s['none']:>12.4f} {s['counts']:>8.4f} {s['sync']:>8.4f} "
              f"{r['counts_over_none']:>12.3f} {r['sync_over_none']:>10.3f} "
              f"{r['validation_over_training_samples_per_second']:>30.2f}")
    print(json.dumps({"model": args.model, "size": args.size, "batch": args.batch, "device": device,
                      "results": results}))


if __name__ == "__main__":
    main()
