"""model-<name>.best.keras: the weights that scored best on validation so far.

The best-so-far value lives in the checkpoint (BestState), next to the
weights it was compared against, so a resumed run neither forgets it nor
replaces a better model with a worse one. Validation runs before the
checkpoint of its slice: a run killed after writing a new best but before
the checkpoint redoes that slice, reaches the same weights and rewrites the
same file. Some validations follow the last checkpoint and are never redone:
the one an export runs when its step was not validated (a --time-limit stop,
the final export). Their best lives only in best.json, so a resumed run also
reads best.json and keeps the better of the two when best.json's step is at
or before the checkpoint it resumes from (a later step belongs to a slice the
run trains again).

Files, each replaced atomically, in this order (best.json last, so when it
names a step the model beside it is at least that new):
    model-<name>.best.keras (+ .best.float32.keras under mixed precision; <name>: project.paths)
    model-<name>.best.thresholds.csv, model-<name>.best.metrics.json
    model-<name>.best.json: {"metric", "value", "previous", counters..., "metrics": {...}}

A fresh fine-tune validates its start before the first step (training.start): that validation is
the first best, exported at step 0, and best.json keeps it as "start" ({"metric", "value",
"used_minibatch": 0}) whichever later step replaces it, so the two compare in one file. When no
validation beats the start, the run ends saying the best export holds the starting weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.training.export import export_model
from deepdanbooru.scoring.metrics import is_improvement, json_ready
from deepdanbooru.training.monitors import Monitor, ValidationReport
from deepdanbooru.training.start import START_TRIGGER
from deepdanbooru.training.validation import report_fields, write_sidecars


@dataclass(frozen=True)
class BestValue:
    metric: str
    value: float
    used_minibatch: int


class BestState(tf.Module):
    """Checkpointed: which metric, its best value, and the step it was reached at (-1: none yet)."""

    def __init__(self):
        super().__init__(name="best_model")
        self.metric = tf.Variable("", dtype=tf.string, trainable=False, name="metric")
        self.value = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="value")
        self.used_minibatch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="used_minibatch")

    # used_minibatch -2: the choice was restarted (the validation split changed): best.json is from before it.
    RESTARTED = -2

    def get(self) -> BestValue | None:
        step = int(self.used_minibatch.numpy())
        if step < 0:
            return None
        return BestValue(self.metric.numpy().decode("utf-8"), float(self.value.numpy()), step)

    @property
    def restarted(self) -> bool:
        return int(self.used_minibatch.numpy()) == self.RESTARTED

    def restart(self) -> None:
        self.used_minibatch.assign(self.RESTARTED)

    def set(self, best: BestValue) -> None:
        self.metric.assign(best.metric)
        self.value.assign(best.value)
        self.used_minibatch.assign(best.used_minibatch)


def best_json_path(best_export: Path) -> Path:
    return best_export.with_name(best_export.stem + ".json")


def _best_json(best_export: Path, metric: str) -> BestValue | None:
    """What best.json beside `best_export` records for `metric`, or None (missing, unreadable, other metric)."""
    try:
        payload = json.loads(best_json_path(best_export).read_text(encoding="utf-8"))
        value, step = float(payload["value"]), int(payload["used_minibatch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return BestValue(metric, value, step) if payload.get("metric") == metric else None


def _start_in_best_json(best_export: Path, metric: str) -> dict | None:
    """The "start" best.json records (a fine-tune's starting figure), when it is of `metric`."""
    try:
        start = json.loads(best_json_path(best_export).read_text(encoding="utf-8")).get("start")
    except (OSError, ValueError, AttributeError):
        return None
    return start if isinstance(start, dict) and start.get("metric") == metric else None


class BestModelMonitor(Monitor):
    """Saves the model whenever `metric` improves on the best validation so far (loss: lower is better)."""

    def __init__(self, path, metric: str, tags, mixed_precision: bool = False, echo=print):
        """`path`: the best export; None: the run's (RunInfo.best_export), known once the network is."""
        self.path = None if path is None else Path(path)
        self.metric = metric
        self.tags = list(tags)
        self.mixed_precision = mixed_precision
        self.echo = echo
        self.state = BestState()
        self.model = None
        self.best: BestValue | None = None
        self.start: dict | None = None  # the validation of a fine-tune's start, as best.json keeps it

    def checkpoint_objects(self):
        return {"best_model": self.state}

    @property
    def float32_copy(self) -> Path | None:
        return self.path.with_name(self.path.stem + ".float32.keras") if self.mixed_precision else None

    def on_train_begin(self, run):
        self.model = run.model
        if self.path is None:
            self.path = run.best_export
        self.start = _start_in_best_json(self.path, self.metric) if run.resumed_from else None
        if run.split_changed:  # said at the start (scoring.split.split_change); kept in every checkpoint from here
            self.state.restart()
            return
        saved = self.state.get()
        if saved is None:
            written = _best_json(self.path, self.metric) if run.resumed_from and not self.state.restarted else None
            if written is None or written.used_minibatch > run.start.used_minibatch:
                return
            saved = written
            self.state.set(saved)
        if saved.metric != self.metric:
            self.echo(f"notice: best_model_metric changed from {saved.metric} to {self.metric}; "
                      f"{self.path.name} will be replaced at the next validation")
            return
        written = _best_json(self.path, self.metric)
        if written is not None and run.resumed_from and written.used_minibatch <= run.start.used_minibatch and \
                is_improvement(self.metric, written.value, saved.value):
            saved = written
            self.state.set(saved)
        self.best = saved
        if run.validation_records:
            self.echo(f"Best so far: {saved.metric} {saved.value:.4f} at step {saved.used_minibatch} ({self.path.name})")

    def on_validation(self, report: ValidationReport, logs):
        value = report.result.get(self.metric)
        if report.trigger == START_TRIGGER:
            self.start = {"metric": self.metric, "value": value, "used_minibatch": report.progress.used_minibatch}
        if not is_improvement(self.metric, value, None if self.best is None else self.best.value):
            return
        previous = self.best
        best = BestValue(self.metric, float(value), report.progress.used_minibatch)
        self._write(report, best, previous)
        self.best = best
        self.state.set(best)
        logs["best"] = {"metric": self.metric, "value": best.value,
                        "previous": None if previous is None else previous.value, "path": str(self.path)}

    def _write(self, report: ValidationReport, best: BestValue, previous: BestValue | None) -> None:
        if self.model is None:
            raise RuntimeError("BestModelMonitor.on_validation before on_train_begin")
        export_model(self.model, self.path, float32_copy=self.float32_copy, tags=self.tags)
        extra = {"best_model_metric": best.metric, "value": best.value,
                 "previous": None if previous is None else previous.value}
        write_sidecars(self.path, self.tags, report, extra)
        payload = {"model": self.path.name, "metric": best.metric, "value": best.value,
                   "previous": extra["previous"], **report_fields(report), "metrics": report.metrics,
                   **({"start": self.start} if self.start is not None else {})}
        write_text_atomic(best_json_path(self.path), json.dumps(json_ready(payload), indent=2, allow_nan=False) + "\n")

    def on_train_end(self, progress):
        self._say_if_the_start_is_best()

    def on_train_stopped(self, progress):
        self._say_if_the_start_is_best()

    def _say_if_the_start_is_best(self) -> None:
        start, best = self.start, self.best
        if start is None or best is None or best.used_minibatch != start["used_minibatch"]:
            return
        self.echo(f"Best: {self.path.name} holds the starting weights (the source model as it was, "
                  f"{best.metric} {best.value:.4f} at step {best.used_minibatch}); no validation since beat them")
