"""Partial fine-tuning (trainable_blocks) against training every layer, side by side in one run.

    python bench/partial.py [--model vit_small_patch16] [--size 64] [--batch 32] [--tags 500]
                            [--blocks 2,1,0] [--steps 5] [--rounds 4]

One variant per setting: trainable_blocks null (every layer) and each N of --blocks, each with its own
model (same seed) frozen by the trainer's own models.partial and stepped by the trainer's TrainStep with
adam, on the same in-memory batch. Variants are timed in interleaved rounds (the order rotating) so drift
in the machine's load hits all alike; per variant the least disturbed round counts (other processes only
ever add time). Also printed per variant: the parameters that train and the optimizer's variables (its
state), and a forward pass alone (training=True, no tape) of the full model, the floor a step cannot go
below. Ratios are samples/s over the full model's. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _variant(model_name, size, n_tags, blocks):
    import keras
    import tensorflow as tf

    from deepdanbooru.models import build_model, make_optimizer
    from deepdanbooru.models.partial import partial_training
    from deepdanbooru.training.step import TrainStep

    keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = build_model(model_name, (size, size, 3), n_tags, seed=0)
        partial = partial_training(model, model_name, blocks)
        if partial is not None:
            partial.freeze()
        optimizer = make_optimizer("adam", 0.001)
        optimizer.build(model.trainable_variables)
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False)
    label = "full" if partial is None else f"blocks={blocks}"
    return label, model, optimizer, step, partial


def _forward(model):
    import tensorflow as tf

    function = tf.function(lambda images: model(images, training=True), autograph=False)
    return lambda batch: function(batch["image"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="vit_small_patch16")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tags", type=int, default=500)
    parser.add_argument("--blocks", default="2,1,0")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)

    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from deepdanbooru.models.builder import parameter_count

    tf.config.experimental.enable_op_determinism()
    images = tf.random.stateless_uniform((args.batch, args.size, args.size, 3), seed=[1, 2])
    labels = tf.cast(tf.random.stateless_uniform((args.batch, args.tags), seed=[3, 4]) < 0.05, tf.float32)
    batch = {"image": images, "label": labels}
    spec = {"image": tf.TensorSpec((None, args.size, args.size, 3), tf.float32),
            "label": tf.TensorSpec((None, args.tags), tf.float32)}

    runs = {}
    for blocks in [None, *(int(b) for b in args.blocks.split(",") if b != "")]:
        label, model, optimizer, step, partial = _variant(args.model, args.size, args.tags, blocks)
        step.bind(spec)
        step(batch)  # trace and first run outside the timing
        trainable = parameter_count(model.trainable_weights)
        runs[label] = {"call": step, "trainable": trainable,
                       "optimizer_state": parameter_count(optimizer.variables),
                       "share": partial.describe() if partial else f"every layer, {trainable:,} parameters"}
        if blocks is None:
            forward = _forward(model)
            forward(batch)
            runs["forward only"] = {"call": forward, "trainable": 0, "optimizer_state": 0,
                                    "share": "the full model's forward pass, no tape (the floor)"}
    names = list(runs)
    seconds = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            call = runs[name]["call"]
            started = time.perf_counter()
            for _ in range(args.steps):
                result = call(batch)
            if result is not None:
                tf.nest.map_structure(lambda t: t.numpy(), result)
            else:
                runs[name]["call"].sums.step.numpy()  # the step's work is done once its counter reads back
            seconds[name].append((time.perf_counter() - started) / args.steps)

    print(f"{args.model} at {args.size}x{args.size}, batch {args.batch}, {args.tags} tags, adam; "
          f"{args.rounds} interleaved rounds of {args.steps} steps, best round per variant")
    full = min(seconds["full"])
    rows = {}
    for name in names:
        best = min(seconds[name])
        rows[name] = {"seconds_per_step": best, "samples_per_second": args.batch / best,
                      "speedup_vs_full": full / best, "trainable_parameters": runs[name]["trainable"],
                      "optimizer_state": runs[name]["optimizer_state"]}
        print(f"{name:>13}: {best * 1000:8.1f} ms/step {args.batch / best:8.1f} samples/s  x{full / best:5.2f} "
              f"of full; optimizer state {runs[name]['optimizer_state']:>11,}; {runs[name]['share']}")
    print(json.dumps({"model": args.model, "size": args.size, "batch": args.batch, "tags": args.tags,
                      "rounds": args.rounds, "steps": args.steps, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
