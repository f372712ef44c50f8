"""What replication costs in the train step: one device vs MirroredStrategy, synchronized vs per-replica BN.

    python bench/distributed.py [--model resnet_small] [--size 64] [--batch 16] [--steps 20] [--replicas 2]

One process splits the CPU into --replicas logical devices (the
DEEPDANBOORU_LOGICAL_CPUS mechanism) and times the trainer's compiled step
(deepdanbooru.training.step.TrainStep) on one in-memory global batch,
repeated, three ways, one after the other:

- one: the default strategy (one device, the single-process path);
- mirrored_sync: MirroredStrategy over the logical devices with batch
  normalization synchronized across replicas (what train-project does);
- mirrored_local: the same with Keras's per-replica batch normalization.

The logical devices share the same cores, so the mirrored runs measure the
cost of replication (split batch, all-reduces, per-replica dispatch), not a
speed-up. Reported: steady samples/s after --warmup steps, and the ratios
mirrored_sync / one and mirrored_sync / mirrored_local. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet_small")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tags", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)

    import keras
    import numpy as np

    from deepdanbooru.models import build_model, make_optimizer
    from deepdanbooru.training.step import TrainStep
    from deepdanbooru.training.strategy import synchronize_batch_norm

    mirrored = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    rng = np.random.default_rng(0)
    element = {"image": rng.random((args.batch, args.size, args.size, 3), dtype=np.float32),
               "label": (rng.random((args.batch, args.tags)) < 0.2).astype(np.float32),
               "position": np.arange(args.batch, dtype=np.int64)}

    def measure(strategy, synchronized: bool) -> float:
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = build_model(args.model, (args.size, args.size, 3), args.tags, seed=0)
            optimizer = make_optimizer("adam", 0.001)
            optimizer.build(model.trainable_variables)
        if synchronized:
            synchronize_batch_norm(model, strategy)
        step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False)
        dataset = tf.data.Dataset.from_tensors(element).repeat().prefetch(2)
        batches = iter(strategy.experimental_distribute_dataset(dataset))
        step.bind(batches.element_spec)
        for _ in range(args.warmup):
            step(next(batches))
        step.sums.step.numpy()
        started = time.perf_counter()
        for _ in range(args.steps):
            step(next(batches))
        step.sums.step.numpy()  # waits for the last step
        return args.steps * args.batch / (time.perf_counter() - started)

    rates = {
        "one": measure(tf.distribute.get_strategy(), False),
        "mirrored_sync": measure(mirrored, True),
        "mirrored_local": measure(mirrored, False),
    }
    for name, rate in rates.items():
        print(f"{name:15s} {rate:8.1f} samples/s")
    ratios = {"mirrored_sync_vs_one": rates["mirrored_sync"] / rates["one"],
              "mirrored_sync_vs_local": rates["mirrored_sync"] / rates["mirrored_local"]}
    for name, ratio in ratios.items():
        print(f"{name:25s} {ratio:.3f}")
    print(json.dumps({"model": args.model, "size": args.size, "batch": args.batch, "replicas": args.replicas,
                      "steps": args.steps, "samples_per_second": {k: round(v, 2) for k, v in rates.items()},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
