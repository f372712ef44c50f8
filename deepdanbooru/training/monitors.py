"""What the trainer tells the outside world, through one small interface.

The loop calls each monitor in list order. Monitors only read: the loop owns
the counters and decides when to stop and when to validate. `logs` dicts
passed to one event are shared by the monitors of that call, Keras-callback
style, so a monitor placed earlier (the best-model saver) can leave a note
that one placed later (the console) prints.

Order of events around a checkpoint: on_bad_images (when the trained slice
had pictures that could not be used), on_validation (when the slice is due
for one), before_checkpoint, the checkpoint is written, on_slice_end (same
`logs` as before_checkpoint, which holds the learning rate in force and,
after the save, checkpoint_seconds). Whatever a monitor must not lose to a kill
(history lines, TensorBoard events, the best-so-far value in its
checkpoint_objects) is therefore durable once the checkpoint exists.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deepdanbooru.project.resume import describe_resume_point
from deepdanbooru.training.schedule import validation_trigger
from deepdanbooru.wording import plural

NAMED_BAD_IMAGES = 3  # pictures a console line names before it only counts the rest


@dataclass
class RunInfo:
    """Fixed for a run; given once to on_train_begin."""

    project: Path
    model_name: str
    input_shape: tuple[int, int, int]
    batch_size: int
    epoch_count: int
    train_records: int
    validation_records: int
    slice_records: int  # records per slice (the last slice of an epoch may be shorter)
    slices_per_epoch: int
    policy: str  # "float32" or "mixed_float16"
    resumed_from: str | None  # checkpoint path, None for a fresh run
    start: "Progress"
    source_model: str | None = None
    validation_fraction: float = 0.0
    validation_frequency_slices: int = 0
    best_model_metric: str = "macro_f1"
    config_path: Path | None = None
    trust_warning: str | None = None  # dataset.trust's line when the split cannot measure the model
    model: Any = None  # the keras.Model being trained, for monitors that export it; they must not change it
    parameters: tuple[int, int] | None = None  # (trainable, non-trainable) of the network that trains
    best_export: Path | None = None  # model-<name>.best.keras, named as the run's exports (project.paths)
    split_changed: bool = False  # the validation split is not the one the resumed checkpoint was validated on


@dataclass
class Progress:
    """Counters as of the last completed step, plus what they mean overall."""

    used_epoch: int
    used_minibatch: int
    used_sample: int
    offset: int
    random_seed: int
    epoch_count: int
    train_records: int

    def fraction(self, position: int | None = None) -> float:
        """Share of all epochs' records handed to the model, `position` records into the current epoch."""
        total = self.epoch_count * self.train_records
        done = self.used_epoch * self.train_records + (self.offset if position is None else position)
        return min(1.0, done / total) if total else 1.0


@dataclass
class StepLog:
    """One console line's worth: means since the previous line."""

    progress: Progress
    loss: float
    precision: float
    recall: float
    f1: float
    samples_per_second: float
    eta_seconds: float | None
    fraction: float
    learning_rate: float | None = None


@dataclass
class ValidationReport:
    """One pass over the validation records with the weights of `progress`."""

    progress: Progress
    trigger: str  # "slice" (every validation_frequency_slices), "epoch" (last slice of an epoch), "export"
    result: dict  # ValidationMetrics.result(): scalar metrics plus "per_tag" arrays
    records: int  # validation records
    skipped: int  # of them, unreadable and left out
    seconds: float
    ema_decay: float | None = None  # set when the weights measured are the moving average (ema_decay)

    @property
    def metrics(self) -> dict:
        """The scalar metrics (no per-tag arrays)."""
        return {key: value for key, value in self.result.items() if key != "per_tag"}


@dataclass
class BadImages:
    """The pictures of one slice that could not be used: left out of training and logged."""

    epoch: int  # 1-based
    first: int  # the slice's epoch positions first..last
    last: int
    count: int
    entries: list  # (position, path, reason) as logged; empty where this process does not log them
    log_path: Path


class Monitor:
    """Base class: override the events you need; every method is a no-op here."""

    def checkpoint_objects(self) -> dict[str, Any]:
        """Trackables (tf.Module, tf.Variable) saved in every checkpoint and restored before on_train_begin.

        Keys must be stable across versions. A checkpoint written before a key
        existed restores everything else and leaves that object as it was made.
        """
        return {}

    def on_train_begin(self, run: RunInfo) -> None:
        pass

    def on_step(self, progress: Progress, position: int) -> None:
        """After every step, host-side counters only: must stay cheap (no tensor reads).

        `position`: records of the current epoch handed to the model so far (an estimate within a slice).
        """

    def on_step_log(self, log: StepLog) -> None:
        pass

    def on_validation(self, report: ValidationReport, logs: dict) -> None:
        """After a validation pass; before the checkpoint that follows it (if any)."""

    def before_checkpoint(self, progress: Progress, logs: dict) -> None:
        """A slice is trained; make durable now what must survive with the checkpoint about to be written."""

    def on_bad_images(self, bad: BadImages) -> None:
        """A slice is trained and some of its pictures could not be used (they are in bad.log_path already)."""

    def on_slice_end(self, progress: Progress, checkpoint: str, logs: dict) -> None:
        pass

    def on_epoch_end(self, progress: Progress, logs: dict) -> None:
        pass

    def on_export(self, path: Path, kind: str) -> None:
        """kind: "epoch", "final" or "float32" (the float32 copy of the previous export)."""

    def on_train_end(self, progress: Progress) -> None:
        pass

    def on_train_stopped(self, progress: Progress) -> None:
        """A --time-limit stop: the run ends before its last epoch, resumable from its last checkpoint."""

    def on_interrupted(self, progress: Progress) -> None:
        """Ctrl-C (KeyboardInterrupt) ended the run at `progress`; it resumes from its last checkpoint."""

    def close(self) -> None:
        """Always called last, also when training stops with an error: release files and writers."""


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class Eta:
    """Time left, from this run's own speed measured from its first progress line on.

    The steps before that line carry tracing and compilation, and a resumed run's records trained before
    the kill are not this run's: neither may enter the speed, or the first ETA is far off.
    """

    def __init__(self, total_records: int):
        self.total = total_records
        self._base: tuple[float, int] | None = None

    def update(self, now: float, done: int) -> float | None:
        """`done`: records handed to the model over the whole training (all epochs), as of `now`."""
        if self._base is None:
            self._base = (now, done)
            return None
        start, start_done = self._base
        if done <= start_done:
            return None
        return max(self.total - done, 0) * (now - start) / (done - start_done)


class ConsoleMonitor(Monitor):
    """The plain text a user (or a log file) sees."""

    def __init__(self, echo=print):
        self.echo = echo
        self._last_validation: ValidationReport | None = None
        self._trust_warning: str | None = None

    def on_train_begin(self, run):
        self._trust_warning = run.trust_warning
        height, width, _ = run.input_shape
        self.echo(f"Records: {run.train_records} training, {run.validation_records} validation")
        self.echo(validation_plan_line(run))
        notice = validation_cost_notice(run)
        if notice:
            self.echo(notice)
        source = f" (from {run.source_model})" if run.source_model else ""
        counts = (f"; {run.parameters[0]:,} trainable and {run.parameters[1]:,} non-trainable parameters"
                  if run.parameters else "")
        self.echo(f"Model: {run.model_name}{source}, input {height}x{width}, batch {run.batch_size}, "
                  f"{run.policy}{counts}")
        self.echo(f"Slices: {run.slices_per_epoch} per epoch of up to {run.slice_records} records, "
                  f"{run.epoch_count} epoch(s)")
        start = run.start
        if run.resumed_from:
            self.echo(f"Resuming from {run.resumed_from}: "
                      f"{describe_resume_point(asdict(start), run.train_records, run.epoch_count)}")
        else:
            self.echo("Starting fresh (no checkpoint)")

    def on_step_log(self, log):
        self.echo(f"epoch {log.progress.used_epoch + 1}/{log.progress.epoch_count} "
                  f"step {log.progress.used_minibatch}: loss {log.loss:.4f} "
                  f"precision {log.precision:.3f} recall {log.recall:.3f} f1 {log.f1:.3f} "
                  f"{log.samples_per_second:.1f} samples/s {100 * log.fraction:.1f}% "
                  f"ETA {format_duration(log.eta_seconds)}")

    def on_validation(self, report, logs):
        self._last_validation = report
        m = report.result
        skipped = f", {report.skipped} unreadable skipped" if report.skipped else ""
        line = (f"Validation at step {report.progress.used_minibatch} ({m['samples']} records{skipped}): "
                f"loss {_number(m['loss'])} micro-F1 {m['micro_f1']:.4f} macro-F1 {m['macro_f1']:.4f} "
                f"mAP {m['map']:.4f} MCC {m['mcc']:.4f} at threshold {m['threshold']:g}; "
                f"best single threshold {m['global_threshold']:g} (micro-F1 {m['global_threshold_f1']:.4f}); "
                f"{report.seconds:.1f} s")
        best = logs.get("best")
        if best:
            line += f"; new best {best['metric']}, saved {Path(best['path']).name}"
        self.echo(line)

    def on_bad_images(self, bad):
        """One line a slice, however many pictures: the first few named, the rest counted, all in the log."""
        named = [f"{path} ({reason.split(':', 1)[0]})" for _, path, reason in bad.entries[:NAMED_BAD_IMAGES]]
        if named and bad.count > len(named):
            named.append(f"and {bad.count - len(named):,} more")
        which = f": {', '.join(named)}" if named else ""
        self.echo(f"warning: {plural(bad.count, 'picture')} of records {bad.first}..{bad.last} in epoch {bad.epoch} "
                  f"could not be read and {'was' if bad.count == 1 else 'were'} skipped{which}; "
                  f"{bad.log_path} lists {'it' if bad.count == 1 else 'them'} with the reasons")

    def on_slice_end(self, progress, checkpoint, logs):
        took = logs.get("checkpoint_seconds")
        took = f", {took:.2f} s" if took is not None else ""
        self.echo(f"Checkpoint {checkpoint} (epoch {progress.used_epoch + 1}, offset {progress.offset}/"
                  f"{progress.train_records}{took})")

    def on_export(self, path, kind):
        self.echo(f"Exported {path}")

    def on_train_end(self, progress):
        if self._trust_warning:  # train-project printed it at the start too
            self.echo(f"warning: {self._trust_warning}")
        self.echo(f"Training complete: {progress.used_epoch} epoch(s), {progress.used_minibatch} steps, "
                  f"{progress.used_sample} samples")
        self._last_figures(FINAL_LABEL)

    def on_train_stopped(self, progress):
        # The figures of the weights at the stop, in the finished run's format under another name: the
        # run is not over, and they need not be its best (the best export keeps those).
        self._last_figures(STOP_LABEL)

    def _last_figures(self, label: str):
        if self._last_validation is not None:
            self.echo(final_validation_line(self._last_validation, label))


def _number(value, digits: int = 4) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


FINAL_LABEL = "Final validation"  # the end of a finished run
STOP_LABEL = "Validation at the stop"  # a --time-limit stop


def final_validation_line(report: ValidationReport, label: str = FINAL_LABEL) -> str:
    """The line a script can grep for at the end of a run: `Final validation (...): micro-F1 X, macro-F1 Y, mAP Z, ...`
    (`Validation at the stop (...)` at a --time-limit stop)."""
    m = report.result
    return (f"{label} (step {report.progress.used_minibatch}, {m['samples']} records): "
            f"micro-F1 {m['micro_f1']:.4f}, macro-F1 {m['macro_f1']:.4f}, mAP {m['map']:.4f}, "
            f"loss {_number(m['loss'])}, MCC {m['mcc']:.4f} at threshold {m['threshold']:g}; "
            f"P=R at {m['pr_threshold']:g} (F1 {m['pr_f1']:.4f}), macro-F1 {m['macro_f1_040']:.4f} and "
            f"macro-MCC {m['macro_mcc_040']:.4f} at 0.4" + _category_figures(m))


def _category_figures(m: dict) -> str:
    parts = [f"{name} P=R at {m[name + '_pr_threshold']:g} (F1 {m[name + '_pr_f1']:.4f}), "
             f"macro-F1 {m[name + '_macro_f1_040']:.4f} at 0.4"
             for name in ("general", "character") if f"{name}_pr_threshold" in m]
    return "".join(f"; {part}" for part in parts)


def validation_plan_line(run: RunInfo) -> str:
    """What validation this run does, or how to turn it on."""
    where = run.config_path or "project.json"
    if run.validation_records:
        every = (f"after every {run.validation_frequency_slices} slice(s) and at each epoch end"
                 if run.validation_frequency_slices else "at each epoch end")
        held = "not trained on from here on (the split changed since the checkpoint)" if run.split_changed else \
            "never trained on"
        return (f"Validation: {run.validation_records} records held out (validation_fraction "
                f"{run.validation_fraction:g}), {held}; validated {every}; best model by {run.best_model_metric}")
    if run.validation_fraction > 0:
        return (f"Validation: off, validation_fraction {run.validation_fraction:g} selected none of the "
                f"{run.train_records} eligible records; raise it in {where} or add posts")
    return (f"Validation: off. To measure the model on held-out records (metrics, calibrated thresholds, "
            f"the best model), set \"validation_fraction\": 0.05 in {where}")


# A validation record costs about 1/4.5 of a training record (forward pass only; docs/performance.md).
VALIDATION_RECORD_COST = 1 / 4.5
VALIDATION_NOTICE_SHARE = 0.10


def validation_cost_notice(run: RunInfo) -> str | None:
    """A notice when validating would take more than 10% of the training time, with what to change."""
    if not run.validation_records or not run.train_records:
        return None
    every = run.validation_frequency_slices
    passes = sum(validation_trigger(number, number == run.slices_per_epoch, every) is not None
                 for number in range(1, run.slices_per_epoch + 1))
    share = passes * run.validation_records * VALIDATION_RECORD_COST / run.train_records
    if share <= VALIDATION_NOTICE_SHARE:
        return None
    where = run.config_path or "project.json"
    advice = (f"raise validation_frequency_slices in {where} (0: epoch ends only) or lower validation_fraction"
              if every else f"lower validation_fraction in {where}")
    return (f"notice: validation will take about {share:.0%} of the training time ({passes} pass(es) of "
            f"{run.validation_records} records per epoch of {run.train_records}); {advice}")


class ProgressBarMonitor(Monitor):
    """A carriage-return bar for terminals; silent when the stream is not a TTY."""

    WIDTH = 30
    INTERVAL = 0.2  # seconds between redraws; redrawing every step would cost more than it shows

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._shown = False
        self._run: RunInfo | None = None

    def on_train_begin(self, run):
        self._run = run

    def on_step(self, progress, position):
        if not self.enabled or self._run is None:
            return
        now = time.monotonic()
        if now - self._last < self.INTERVAL:
            return
        self._last = now
        fraction = progress.fraction(position)
        filled = int(self.WIDTH * fraction)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {100 * fraction:5.1f}% epoch {progress.used_epoch + 1}/"
                          f"{progress.epoch_count} record {position}/{progress.train_records}")
        self.stream.flush()
        self._shown = True

    def _clear(self):
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    # Every other event prints a line: clear the bar first so the line starts clean.
    def on_step_log(self, log):
        self._clear()

    def on_validation(self, report, logs):
        self._clear()

    def on_bad_images(self, bad):
        self._clear()

    def on_slice_end(self, progress, checkpoint, logs):
        self._clear()

    def on_epoch_end(self, progress, logs):
        self._clear()

    def on_export(self, path, kind):
        self._clear()

    def on_train_end(self, progress):
        self._clear()


def default_monitors(echo=print, stream=None) -> list[Monitor]:
    # The bar comes first so it clears its line before the console prints.
    return [ProgressBarMonitor(stream), ConsoleMonitor(echo)]
