"""The learning rate as a pure function of the resume counters, so a resumed run sets the same rates.

    steps          DeepDanbooru's: learning_rates' entry for used_epoch (else learning_rate), set per epoch
    warmup_cosine  per minibatch u (used_minibatch before the step), with S = minibatches per epoch:
                   u < W = round(warmup_epochs * S):  learning_rate * (u + 1) / W
                   otherwise:  min + (learning_rate - min) * (1 + cos(pi * (u - W) / (T - W))) / 2,
                   T = epoch_count * S, held at min once u reaches T

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LearningRateSchedule:
    config: object  # ProjectConfig
    train_records: int

    @property
    def per_minibatch(self) -> bool:
        return self.config.lr_schedule == "warmup_cosine"

    @property
    def minibatches_per_epoch(self) -> int:
        # Slices are whole minibatches except the epoch's last, so an epoch is ceil(records / batch) steps.
        return max(1, -(-self.train_records // self.config.minibatch_size))

    def rate(self, used_epoch: int, used_minibatch: int) -> float:
        config = self.config
        if not self.per_minibatch:
            return config.learning_rate_for_epoch(used_epoch)
        per_epoch = self.minibatches_per_epoch
        total = config.epoch_count * per_epoch
        warmup = min(round(config.warmup_epochs * per_epoch), total)
        if used_minibatch < warmup:
            return config.learning_rate * (used_minibatch + 1) / warmup
        if used_minibatch >= total:
            return config.min_learning_rate
        progress = (used_minibatch - warmup) / (total - warmup)
        return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) \
            * 0.5 * (1.0 + math.cos(math.pi * progress))
