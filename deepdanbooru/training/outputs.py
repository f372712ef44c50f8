"""Validation and exports: the two things a run writes about its weights.

Both see the weights that are measured (the moving average with ema_decay, swapped in and out, else the
trained ones), both are timed for --time-limit, both tell the monitors. An export validates first when
its step was not validated yet, for the thresholds and metrics written beside it.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from deepdanbooru.training.export import export_model
from deepdanbooru.training.monitors import ValidationReport
from deepdanbooru.training.validation import Validator, write_sidecars


class Outputs:
    def __init__(self, plan, model, ema, monitors, jit_compile: bool, echo=print):
        self.plan, self.model, self.ema, self.monitors = plan, model, ema, monitors
        self.budget = plan.time_budget
        # Validation writes reports and exports: the chief's job in a cluster.
        self.validator = Validator(model, plan.validation, plan.tags, plan.config, plan.paths.bad_images,
                                   jit_compile, echo) \
            if len(plan.validation) and plan.role.is_chief else None

    def averaged(self):
        """The weights validation and exports use: the moving average with ema_decay, else the trained ones."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

    def validate(self, progress, trigger: str) -> ValidationReport | None:
        """Validate now (None without validation records or off the chief)."""
        if self.validator is None:
            return None
        # The best-model monitor exports from on_validation: it must see the weights that were measured.
        with self.averaged():
            report = self.validator.run(progress, trigger)
            if self.budget is not None:
                self.budget.validation_took(report.seconds)
            logs: dict = {}
            for monitor in self.monitors:
                monitor.on_validation(report, logs)
        return report

    def export(self, path: Path, kind: str, progress) -> None:
        if not self.plan.role.is_chief:
            return  # exports read the mirrored weights without collectives: the chief alone writes them
        started = time.monotonic()
        copy = self.plan.paths.float32_copy(path) if self.plan.config.mixed_precision else None
        with self.averaged():
            written = export_model(self.model, path, float32_copy=copy, tags=self.plan.tags)
            if self.validator is not None:
                report = self.validator.for_step(progress.used_minibatch) or self.validate(progress, "export")
                write_sidecars(path, self.plan.tags, report)
        if self.budget is not None:
            self.budget.export_took(time.monotonic() - started)
        for monitor in self.monitors:
            monitor.on_export(written[0], kind)
            if copy is not None:
                monitor.on_export(written[1], "float32")
