"""The one place that chooses the tf.distribute strategy.

The loop is written against the strategy API (scope, distributed datasets,
`run`, `reduce`), so adding Mirrored or MultiWorker support means changing
only this function.
"""

from __future__ import annotations

import tensorflow as tf


def choose_strategy() -> tf.distribute.Strategy:
    """For now the default strategy: one device, no replication."""
    return tf.distribute.get_strategy()
