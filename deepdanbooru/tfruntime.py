"""TensorFlow runtime settings that training and inference share."""

from __future__ import annotations

import tensorflow as tf


def tune_graph_optimizer() -> None:
    """Without a GPU, skip grappler's rewrites of compiled functions (process-wide; training and inference).

    On a CPU they cost ~7 s of the first train step of resnet_custom_v4 (17.0 s -> 9.6 s in one process,
    side by side) and ~0.4 s of the first inference call, and gain nothing per step (training 1.14 / 1.06 s,
    inference 0.39-0.41 s either way; docs/performance.md). With a GPU they stay on: the layout optimizer
    and the remapper's fused kernels matter there.
    """
    if not tf.config.list_logical_devices("GPU"):
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
