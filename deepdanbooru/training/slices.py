"""Training one slice: its input, its steps, the per-step monitors and console lines, its bad images."""

from __future__ import annotations

import dataclasses

import numpy as np

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.pipeline import TrainingInput
from deepdanbooru.training.data import Epoch, shard_reader, slice_input
from deepdanbooru.training.monitors import BadImages


class SliceRunner:
    """Runs the compiled step over epoch positions start..stop-1 and keeps the counters in step with it."""

    def __init__(self, plan, strategy, worker_sums, step, optimizer, rates, counters, report, monitors, check_finite):
        self.plan, self.config, self.paths = plan, plan.config, plan.paths
        self.strategy, self.worker_sums, self.step, self.optimizer = strategy, worker_sums, step, optimizer
        self.rates, self.counters, self.report, self.monitors = rates, counters, report, monitors
        self.check_finite = check_finite
        self.train_paths = plan.train.paths()
        budget = plan.time_budget
        # Only data-service input can block inside a slice (waiting for a batch): it stops at the limit.
        self.input_options = dataclasses.replace(TrainingInput.from_config(self.config),
                                                 deadline=budget.deadline if budget is not None else None)
        self.shards = shard_reader(plan.shards)  # None: the pictures come from their files

    def train(self, order: np.ndarray, start: int, stop: int) -> None:
        """Train on epoch positions start..stop-1, then count the bad images among them against the limit."""
        c = self.counters
        epoch = Epoch(self.train_paths, self.plan.train.tag_strings, self.plan.tags, order, c.used_epoch + 1,
                      c.random_seed, self.paths.bad_images, self.shards)
        source = slice_input(self.strategy, self.plan.role, self.worker_sums, epoch, self.input_options, start, stop)
        self.step.bind(source.dataset.element_spec)
        steps = 0
        for batch in source.dataset:
            # The steps schedule's rate is set per slice too: a "fit" plan made before the last checkpoint moves
            # its used_fraction drops from here on, as it does in a run resumed from that checkpoint.
            if self.rates.per_minibatch or not steps:
                self.optimizer.learning_rate = self.rates.rate(c.used_epoch, c.used_minibatch)
            self.step(batch)
            steps += 1
            c.used_minibatch += 1
            source.observe(self.strategy.experimental_local_results(batch["position"]))
            position = self.report.position = min(start + steps * self.config.minibatch_size, stop)
            for monitor in self.monitors:
                monitor.on_step(self.report.progress(), position)
            if c.used_minibatch % self.config.console_logging_frequency_mb == 0:
                self.check_finite()
                self.report.log(position)
        bad = source.finish()
        if bad:
            report = BadImages(c.used_epoch + 1, start, stop - 1, bad, source.bad_entries, self.paths.bad_images)
            for monitor in self.monitors:
                monitor.on_bad_images(report)
        self.check_finite()
        if steps == 0:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"no usable batch in records {start}..{stop - 1} of epoch {c.used_epoch + 1}: "
                f"all {stop - start} images failed to load (they are listed in this file)"))
        self._count_bad_images(bad, stop)

    def _count_bad_images(self, bad: int, stop: int) -> None:
        c = self.counters
        c.epoch_bad_images += bad
        if c.epoch_bad_images > self.config.max_bad_image_fraction * stop:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"{c.epoch_bad_images} of {stop} images in epoch {c.used_epoch + 1} failed to load, more than "
                f"max_bad_image_fraction {self.config.max_bad_image_fraction} of {self.config.config_path}; "
                "fix or remove the images listed in this file, or raise the limit"))
