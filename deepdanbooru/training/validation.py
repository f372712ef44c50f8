"""The trainer's validation: its held-out records measured with the current weights (scoring.scorer)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.models.losses import project_loss
from deepdanbooru.project.resume import resume_point
from deepdanbooru.pipeline import BadImageTracker
from deepdanbooru.pipeline.packed import scoring_input
from deepdanbooru.project.categories import category_indices, tag_categories
from deepdanbooru.scoring.metrics import write_metrics_json, write_thresholds_csv
from deepdanbooru.scoring.scorer import BatchScorer, measure
from deepdanbooru.training.monitors import Progress, ValidationReport


class Validator:
    """The trainer's validation split, ready to be measured with the current weights at any moment."""

    def __init__(self, model, records, tags, config, bad_image_log, jit_compile: bool, echo=print):
        self.config = config
        # From the shards' validation part when the project is packed (pipeline.packed.scoring_input).
        scoring = scoring_input(config.project_dir, config, records, tags)
        self.paths, self.dataset, self._diagnose = scoring.paths, scoring.dataset, scoring.diagnose
        self.records = len(self.paths)
        self.bad_image_log = Path(bad_image_log)
        # The project's loss without tag_loss_weights: the figure evaluate-project --metrics computes too.
        self.scorer = BatchScorer(model, project_loss(config, "none"), config.image_height, config.image_width,
                                  jit_compile=jit_compile, echo=echo)
        self.categories = category_indices(tag_categories(list(tags), config.project_dir))
        self.latest: ValidationReport | None = None
        self._logged_bad = False

    def for_step(self, used_minibatch: int) -> ValidationReport | None:
        """The latest report if it was taken with the weights after step `used_minibatch`."""
        if self.latest is not None and self.latest.progress.used_minibatch == used_minibatch:
            return self.latest
        return None

    def run(self, progress: Progress, trigger: str) -> ValidationReport:
        started = time.monotonic()
        seen: list[np.ndarray] = []
        try:
            metrics = measure(self.scorer, self.dataset, self.config.validation_threshold, seen.append,
                              self.categories)
        except ValueError as error:
            # ValidationMetrics refuses NaN / out-of-range scores: the weights went bad without the loss showing it.
            raise TrainingError(file_field(
                self.config.config_path, "learning_rate",
                f"validation at step {progress.used_minibatch}: {error}; the weights are no longer finite. Lower "
                "the learning rate or set gradient_clip_norm, then run train-project again")) from None
        skipped = self.records - metrics.samples
        if skipped and not self._logged_bad:
            # Once per process: every later pass meets the same files.
            tracker = BadImageTracker(self.bad_image_log, self.paths, max_image_pixels=self.config.max_image_pixels,
                                      context="validation", diagnose_path=self._diagnose)
            for positions in seen:
                tracker.observe(positions)
            tracker.finish(0, self.records)
            self._logged_bad = True
        if metrics.samples == 0:
            raise TrainingError(file_field(
                self.bad_image_log, None,
                f"none of the {self.records} validation images could be read (they are listed in this file)"))
        self.latest = ValidationReport(progress=progress, trigger=trigger, result=metrics.result(),
                                       records=self.records, skipped=skipped, seconds=time.monotonic() - started,
                                       ema_decay=self.config.ema_decay)
        return self.latest


def sidecar_paths(export_path) -> tuple[Path, Path]:
    """model-x.e3.keras -> (model-x.e3.thresholds.csv, model-x.e3.metrics.json)."""
    export_path = Path(export_path)
    return (export_path.with_name(export_path.stem + ".thresholds.csv"),
            export_path.with_name(export_path.stem + ".metrics.json"))


def report_fields(report: ValidationReport) -> dict:
    """Where the figures come from: counters of the weights measured, and the split."""
    # The last slice of an epoch is validated before used_epoch moves on; resume_point counts it as done,
    # as state.json and preflight do.
    point = resume_point(asdict(report.progress), report.progress.train_records)
    return {
        "trigger": report.trigger,
        **point,
        "epochs_completed": point["used_epoch"],
        "validation_records": report.records,
        "skipped_images": report.skipped,
        "seconds": round(report.seconds, 3),
        # Which weights the export holds and these figures measure: the trained ones unless ema_decay is set.
        **({"weights": "ema", "ema_decay": report.ema_decay} if report.ema_decay is not None else {}),
    }


def write_sidecars(export_path, tags, report: ValidationReport, extra: dict | None = None) -> list[Path]:
    """`<stem>.thresholds.csv` and `<stem>.metrics.json` beside an export, each written atomically."""
    thresholds, metrics = sidecar_paths(export_path)
    write_thresholds_csv(thresholds, tags, report.result)
    write_metrics_json(metrics, report.result, {"model": Path(export_path).name, **report_fields(report),
                                                **(extra or {})})
    return [thresholds, metrics]
