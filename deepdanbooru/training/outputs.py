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
from deepdanbooru.training.wise import CHOICE_METRIC, MIXED_EXPORTS, TRIGGER as WISE_TRIGGER


class Outputs:
    def __init__(self, plan, model, ema, monitors, jit_compile: bool, echo=print, wise=None):
        self.plan, self.model, self.ema, self.monitors = plan, model, ema, monitors
        self.wise, self.echo = wise, echo  # wise_ft's training.wise.StartWeights, or None
        self.budget = plan.time_budget
        # Validation writes reports and exports: the chief's job in a cluster.
        self.validator = Validator(model, plan.validation, plan.tags, plan.config, plan.paths.bad_images,
                                   jit_compile, echo) \
            if len(plan.validation) and plan.role.is_chief else None
        if wise is not None and not len(plan.validation) and plan.role.is_chief:
            echo(f"notice: wise_ft in {plan.config.config_path} chooses its mix on the validation split, and this "
                 "run has none (validation_fraction 0): its exports hold the trained weights")

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
            self._measured(report)
        return report

    def _measured(self, report) -> None:
        if self.budget is not None:
            self.budget.validation_took(report.seconds)
        logs: dict = {}
        for monitor in self.monitors:
            monitor.on_validation(report, logs)

    def export(self, path: Path, kind: str, progress) -> None:
        if not self.plan.role.is_chief:
            return  # exports read the mirrored weights without collectives: the chief alone writes them
        started = time.monotonic()
        copy = self.plan.paths.float32_copy(path) if self.plan.config.mixed_precision else None
        with self.averaged():
            if self.wise is not None and self.validator is not None and kind in MIXED_EXPORTS:
                written = self._export_mixed(path, copy, progress)
            else:
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

    def _export_mixed(self, path: Path, copy, progress) -> list[Path]:
        """wise_ft: each mixing weight validated, the best one's weights exported with its figures (training.wise)."""
        validator = self.validator
        alpha, report, tried = self.wise.choose(lambda: validator.run(progress, WISE_TRIGGER))
        validator.latest = report
        with self.wise.mixed(alpha):
            # Monitors see the chosen mix as this step's validation: the history, and the best model if it beats it.
            self._measured(report)
            written = export_model(self.model, path, float32_copy=copy, tags=self.plan.tags)
            write_sidecars(path, self.plan.tags, report, {"wise_ft": {
                "alpha": alpha, "metric": CHOICE_METRIC, "tried": {f"{a:g}": value for a, value in tried.items()}}})
        figures = ", ".join(f"{a:g}: {value:.4f}" for a, value in tried.items())
        held = "the trained weights (a = 1)" if alpha == 1.0 else \
            f"{1 - alpha:g} x the start + {alpha:g} x the trained weights"
        self.echo(f"wise_ft: {path.name} holds {held}, the best validation mAP of the mixes tried ({figures})")
        return written

