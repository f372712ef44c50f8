"""What a run says about itself: its counters as Progress, the step log with its ETA, the run's description,
and the lines it ends with when stopped (Ctrl-C, --time-limit)."""

from __future__ import annotations

import shlex
import time
from dataclasses import replace

from deepdanbooru.project.resume import describe_resume_point
from deepdanbooru.training.monitors import Eta, Progress, RunInfo, StepLog, format_duration


class RunReport:
    """Reads the counters, the step's in-graph sums and the schedules; writes only through the monitors."""

    def __init__(self, plan, schedule, rates, counters, sums, monitors):
        self.plan, self.schedule, self.rates, self.counters, self.sums = plan, schedule, rates, counters, sums
        self.monitors = monitors
        self.budget = plan.time_budget
        # used_sample at the start of this process; the step's sums add what this process trains.
        self._base_samples = counters.used_sample
        self._last_log = time.monotonic()
        # Samples of the window restored with the checkpoint (trained before this process): not in its speed.
        self._carried_samples = float(sums.samples.numpy()) if sums is not None else 0.0
        self._eta = Eta(schedule.done_records(schedule.epoch_count, 0))
        self.position = counters.offset  # records of the current epoch handed to the model

    def samples_trained(self) -> int:
        """used_sample now: what earlier processes trained plus what this one's step has counted."""
        return self._base_samples + int(self.sums.total_samples.numpy())

    def progress(self) -> Progress:
        c = self.counters
        return Progress(c.used_epoch, c.used_minibatch, c.used_sample, c.offset, c.random_seed,
                        self.schedule.epoch_count, self.schedule.train_records)

    def rate(self) -> float:
        """The rate the last step used (warmup_cosine sets it before each step, from the count before it)."""
        c = self.counters
        last = c.used_minibatch - 1 if self.rates.per_minibatch and c.used_minibatch else c.used_minibatch
        return self.rates.rate(c.used_epoch, last)

    def eta(self, now: float, position: int) -> float | None:
        """Seconds to the end of training, or to the --time-limit stop when that comes first."""
        self._eta.total = self.schedule.done_records(self.schedule.epoch_count, 0)  # epoch_count "fit" plans it
        eta = self._eta.update(now, self.schedule.done_records(self.counters.used_epoch, position))
        if eta is not None and self.budget is not None:
            eta = min(eta, max(self.budget.seconds - self.budget.elapsed(), 0.0))
        return eta

    def log(self, position: int) -> None:
        window = self.sums.read_window()
        now = time.monotonic()
        samples = window["samples"]
        elapsed = max(now - self._last_log, 1e-9)
        self._last_log = now
        timed, self._carried_samples = samples - self._carried_samples, 0.0
        tp, fp, fn = window["true_positives"], window["false_positives"], window["false_negatives"]
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        progress = replace(self.progress(), used_sample=self.samples_trained())
        log = StepLog(progress=progress, loss=window["loss_sum"] / samples if samples else float("nan"),
                      precision=precision, recall=recall, f1=f1, samples_per_second=timed / elapsed,
                      eta_seconds=self.eta(now, position), fraction=progress.fraction(position),
                      learning_rate=self.rate())
        for monitor in self.monitors:
            monitor.on_step_log(log)

    def interrupt_message(self, saved) -> str:
        """Where the run stands, what its last checkpoint (`saved`: (path, counters) or None) holds, and that
        the same command resumes."""
        c, epochs, n = self.counters, self.schedule.epoch_count, self.schedule.train_records
        stands = (f"stopped in epoch {min(c.used_epoch + 1, epochs)} of {epochs} at record {self.position} of "
                  f"{n} (step {c.used_minibatch})")
        if saved is None:
            return f"{stands}; no checkpoint was written yet, so running the same command starts fresh"
        path, counters = saved
        return (f"{stands}; the last checkpoint {path} holds {describe_resume_point(vars(counters), n, epochs)}; "
                "running the same command resumes from it")

    def time_limit_message(self, checkpoint, export) -> str:
        c, schedule, budget = self.counters, self.schedule, self.budget
        limit = f" --time-limit {budget.text}" if budget is not None else ""
        elapsed = f" after {format_duration(budget.elapsed())}" if budget is not None else ""
        again = f"deepdanbooru train-project {shlex.quote(str(self.plan.paths.root))}{limit}"
        return (f"Stopped for the time limit{elapsed} at epoch {c.used_epoch + 1}/{schedule.epoch_count}, "
                f"record {c.offset}/{schedule.train_records}, step {c.used_minibatch}: "
                f"{checkpoint} and {export.name} are written. To continue from there, "
                f"run train-project again, e.g. {again}")

    def run_info(self, model, policy: str, resumed_from, network) -> RunInfo:
        """`network` (training.network.Network): what trains, named as checkpoints and exports name it."""
        plan, schedule, config = self.plan, self.schedule, self.plan.config
        return RunInfo(
            project=plan.paths.root, model_name=network.name, input_shape=config.input_shape,
            batch_size=config.minibatch_size, epoch_count=schedule.epoch_count,
            train_records=schedule.train_records, validation_records=len(plan.validation),
            slice_records=schedule.slice_records, slices_per_epoch=schedule.slices_per_epoch, policy=policy,
            resumed_from=resumed_from, start=self.progress(),
            source_model=network.source or None, parameters=(network.trainable, network.non_trainable),
            validation_fraction=config.validation_fraction,
            validation_frequency_slices=schedule.validation_every,
            best_model_metric=config.best_model_metric, config_path=config.config_path,
            trust_warning=plan.trust_warning if plan.role.is_chief else None,
            model=model, best_export=plan.paths.best_export(network.exports),
            split_changed=plan.split_changed is not None)
