"""The slice loop: train, checkpoint, resume, export (docs/training.md).

    while used_epoch < epoch_count:
        order = permutation(train records, seed=(seed, random_seed))
        learning rate = schedule(used_epoch)
        while offset < len(records):
            (--time-limit: stop and export here if the next slice and its exports would not fit)
            train on order[offset : offset + checkpoint_frequency_mb * minibatch_size]
            count the bad images; offset = end of the slice
            validate when due; checkpoint (latest 3 kept); mirror to state.json
        used_epoch += 1; random_seed += 1; offset = 0; export when due
    export the final model

Every random choice is a function of (seed, random_seed, position), the
checkpoint holds every counter next to the weights and optimizer, and each
slice is batched on its own, so a run restarted from any checkpoint forms the
same batches with the same augmentation as a run that never stopped.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from deepdanbooru.errors import Interrupted, TrainingError, file_field
from deepdanbooru.models import make_optimizer
from deepdanbooru.models.losses import project_loss
from deepdanbooru.models.optimizers import decay_exempt
from deepdanbooru.models.precision import MIXED, choose_policy
from deepdanbooru.pipeline import TrainingInput
from deepdanbooru.project.resume import describe_resume_point
from deepdanbooru.project.tags import tags_hash
from deepdanbooru.runstate.state import Counters, RunIdentity, check_identity, write_state_json
from deepdanbooru.scoring.split import records_hash
from deepdanbooru.training.chief import checkpoint_manager
from deepdanbooru.training.data import Epoch, slice_input
from deepdanbooru.training.ema import WeightAverage, checkpoint_has_average
from deepdanbooru.training.export import export_model
from deepdanbooru.training.freeze import BackboneFreeze
from deepdanbooru.training.making import Priors, make_model
from deepdanbooru.training.monitors import Eta, Progress, RunInfo, StepLog, ValidationReport, format_duration
from deepdanbooru.training.schedule import LearningRateSchedule, Schedule
from deepdanbooru.training.sharding import WorkerSums, check_same_setup, setup_fingerprints
from deepdanbooru.training.state import ResumeState, read_checkpoint_state
from deepdanbooru.training.step import TrainStep, build_optimizer
from deepdanbooru.training.strategy import check_global_batch, describe_strategy, synchronize_batch_norm
from deepdanbooru.training.validation import Validator, write_sidecars

KEEP_CHECKPOINTS = 3


class LossScaleState(tf.Module):
    """The loss scale's variables under a fixed checkpoint key in both precisions.

    Under float32 they are unused placeholders; keeping the key lets a run
    switch between float32 and mixed precision (e.g. CPU to GPU) and still
    resume: the model and inner-optimizer state are the same either way.
    """

    def __init__(self, optimizer=None):
        super().__init__(name="loss_scale")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            self.dynamic_scale = optimizer.dynamic_scale.value
            self.step_counter = optimizer.step_counter.value
        else:
            self.dynamic_scale = tf.Variable(1.0, dtype=tf.float32, trainable=False, name="dynamic_scale")
            self.step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_counter")


def _enable_determinism(seed: int) -> None:
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def _monitor_state(monitors) -> tf.Module:
    """The monitors' checkpoint_objects under one key, so they never collide with the trainer's own."""
    state = tf.Module(name="monitors")
    for monitor in monitors:
        for name, trackable in monitor.checkpoint_objects().items():
            if hasattr(state, name):
                raise ValueError(f"two monitors save state under the checkpoint key {name!r}")
            setattr(state, name, trackable)
    return state


class SliceTrainer:
    """One train-project run: the model, optimizer, checkpoint and counters, and the loop over them.

    Built in the order TensorFlow needs: the strategy exists already (train.py
    chose it before anything started TensorFlow's runtime), then the model and
    optimizer are created in its scope, then the checkpoint is restored into
    them, then the step is compiled around them.
    """

    def __init__(self, plan, strategy, monitors, echo=print):
        self.plan, self.config, self.paths = plan, plan.config, plan.paths
        self.strategy, self.role = strategy, plan.role
        self.monitors = list(monitors)
        self.echo = echo
        self.train_records = plan.train
        self.train_paths = plan.train.paths()
        self.schedule = Schedule.from_config(self.config, len(plan.train))
        self.input_options = TrainingInput.from_config(self.config)
        # The learning rate per epoch (steps) or per minibatch (warmup_cosine).
        self.rates = LearningRateSchedule(self.config, len(plan.train))
        self.priors = Priors(plan)

        check_global_batch(strategy, self.config.minibatch_size, self.config.config_path)
        echo(describe_strategy(strategy, self.role, self.config.minibatch_size))
        _enable_determinism(self.config.seed)
        self.policy = choose_policy(self.config.mixed_precision, plan.force_mixed_precision, echo)
        self.identity = RunIdentity(self.config.model, self.config.image_height, self.config.image_width,
                                    tags_hash(plan.tags), len(plan.tags))
        self.records_hash = records_hash(plan.train)
        self.latest = self._latest_checkpoint_of_this_setup()
        self._build_model_and_optimizer()
        self.counters = self._restore()
        self.worker_sums = self._agree_with_the_other_workers()
        self.step = TrainStep(strategy, self.model, self.optimizer,
                              project_loss(self.config, "none", self.priors.loss_weights()),
                              loss_scaled=self.policy == MIXED, ema=self.ema)
        self.freeze = BackboneFreeze(self.model, self._core["optimizer"], self.config.freeze_backbone_epochs,
                                     on_change=self.step.retrace, echo=echo)
        self.step.sums.step.assign(self.counters.used_minibatch)
        # used_sample at the start of this process; the step's sums add what this process trains.
        self._base_samples = self.counters.used_sample
        # Validation writes reports and exports: the chief's job in a cluster.
        self.validator = Validator(self.model, plan.validation, plan.tags, self.config, self.paths.bad_images) \
            if len(plan.validation) and self.role.is_chief else None
        self.budget = plan.time_budget
        self._last_log = time.monotonic()
        self._eta = Eta(self.schedule.done_records(self.schedule.epoch_count, 0))
        # What the latest checkpoint holds, for the interrupt message: (path, counters) or None.
        self._saved = (self.latest, replace(self.counters)) if self.latest else None
        self._position = self.counters.offset  # records of the current epoch handed to the model

    # --- setting up ---

    def _latest_checkpoint_of_this_setup(self) -> str | None:
        latest = tf.train.latest_checkpoint(str(self.paths.checkpoints))
        if latest:
            _, saved = read_checkpoint_state(latest)
            check_identity(saved, self.identity, self.paths.checkpoints, self.paths.tags, self.config.config_path)
        return latest

    def _build_model_and_optimizer(self) -> None:
        with self.strategy.scope():
            self.model = make_model(self.plan, self.policy, self.priors, bool(self.latest), self.echo,
                                    write_report=self.role.is_chief)
            rate = self.rates.rate(0, 0)
            self.optimizer, inner = build_optimizer(
                # The inner optimizer clips, i.e. after the loss-scale optimizer has unscaled the gradients.
                lambda: make_optimizer(self.config.optimizer, rate, global_clipnorm=self.config.gradient_clip_norm,
                                       weight_decay=self.config.decay, decay_exempt_variables=decay_exempt(self.model)),
                self.policy == MIXED)
            # Built before any restore, so every slot exists and the restore fills it in place.
            self.optimizer.build(self.model.trainable_variables)
            self.ema = WeightAverage(self.model, self.config.ema_decay) if self.config.ema_decay else None
        synchronize_batch_norm(self.model, self.strategy)
        self.state = ResumeState()
        self._core = dict(model=self.model, optimizer=inner, state=self.state,
                          loss_scale=LossScaleState(self.optimizer))
        if self.ema is not None:
            self._core["ema"] = self.ema.state
        self.checkpoint = tf.train.Checkpoint(**self._core, monitors=_monitor_state(self.monitors))
        # Only the chief writes checkpoints; a worker's manager only counts them.
        self.manager = checkpoint_manager(self.checkpoint, self.paths.checkpoints, self.role, self.latest,
                                          self.model.variables + self.optimizer.variables, KEEP_CHECKPOINTS)

    def _restore(self) -> Counters:
        if not self.latest:
            return Counters()
        core = self._core
        saved_average = checkpoint_has_average(self.latest)
        fresh_average = self.ema is not None and not saved_average
        if fresh_average:
            # Written before ema_decay was set: the rest must match; the average then starts at those weights.
            core = {key: value for key, value in core.items() if key != "ema"}
        try:
            status = self.checkpoint.restore(self.latest)
            if saved_average and self.ema is None:
                status.expect_partial()  # ema_decay turned off: the saved average is left unread, without a warning
            if not self.role.is_chief:
                status.expect_partial()  # a worker has no monitors: their saved state is the chief's alone
            try:
                status.assert_existing_objects_matched()
            except AssertionError:
                # Monitor state (e.g. the best-so-far value) may predate this checkpoint; only the core must match.
                tf.train.Checkpoint(**core).read(self.latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise TrainingError(file_field(
                self.latest, None,
                f"does not fit the model being trained ({reason}); resume with the same model "
                f"(and --source-model) it was saved with, or delete {self.paths.checkpoints} to start fresh"
            )) from None
        if fresh_average:
            self.ema.reset()
            self.echo(f"notice: {self.latest} holds no weight average; ema_decay starts it at the restored weights")
        counters = self.state.counters()
        saved_records = self.state.records_hash.numpy().decode()
        if saved_records and saved_records != self.records_hash and counters.offset:
            self.echo(f"notice: the training records changed since {self.latest}; the current epoch "
                      f"continues at offset {counters.offset} of the new order, so some records of this "
                      "epoch may be seen twice or not at all")
        return counters

    def _agree_with_the_other_workers(self) -> WorkerSums | None:
        if not self.role.in_cluster:
            return None
        sums = WorkerSums(self.strategy)
        check_same_setup(sums, self.role, setup_fingerprints(
            self.config, self.identity, self.records_hash, self.counters, self.latest))
        return sums

    # --- the loop ---

    def run(self) -> Counters:
        try:
            return self._run()
        except KeyboardInterrupt:
            raise Interrupted(self._interrupt_message()) from None
        finally:
            for monitor in self.monitors:
                monitor.close()

    def _run(self) -> Counters:
        c, schedule = self.counters, self.schedule
        for monitor in self.monitors:
            monitor.on_train_begin(self._run_info())
        if schedule.trained_out(c.used_epoch, c.offset):
            self.echo(f"Training already complete ({schedule.epoch_count} of {schedule.epoch_count} epochs); "
                      f"writing the exports again. Raise epoch_count in {self.config.config_path} to train further")
        while c.used_epoch < schedule.epoch_count:
            order = schedule.order(c.random_seed)
            self.optimizer.learning_rate = self.rates.rate(c.used_epoch, c.used_minibatch)
            self.freeze.at_epoch(c.used_epoch, c.offset)
            while c.offset < schedule.train_records:
                if not self._another_slice_fits():
                    return self._stop_for_time_limit()
                started = time.monotonic()
                stop = schedule.slice_stop(c.offset)
                bad = self._train_slice(order, c.offset, stop)
                self._count_bad_images(bad, stop)
                c.used_sample = self._samples_trained()
                c.offset = stop
                # Before the checkpoint, so what validation changes (best-so-far value, history) is saved with it.
                trigger = schedule.validation_after(stop)
                if trigger and self.validator is not None:
                    self._validate(trigger)
                self._checkpoint()
                if self.budget is not None:
                    self.budget.slice_took(time.monotonic() - started)
            self._end_epoch()
        self._export(self.paths.final_export(self.config.model), "final")
        # No checkpoint here: it would repeat the last slice's at the cost of a full save. The mirror
        # records the counters after the epoch end, for preflight to say that training is complete.
        if self.manager.latest_checkpoint:
            self._write_mirror(self.manager.latest_checkpoint, complete=True)
        for monitor in self.monitors:
            monitor.on_train_end(self._progress())
        return c

    def _train_slice(self, order: np.ndarray, start: int, stop: int) -> int:
        """Train on epoch positions start..stop-1; returns how many of them were bad images."""
        c = self.counters
        epoch = Epoch(self.train_paths, self.train_records.tag_strings, self.plan.tags, order, c.used_epoch + 1,
                      c.random_seed, self.paths.bad_images)
        source = slice_input(self.strategy, self.role, self.worker_sums, epoch, self.input_options, start, stop)
        self.step.bind(source.dataset.element_spec)
        steps = 0
        for batch in source.dataset:
            if self.rates.per_minibatch:
                self.optimizer.learning_rate = self.rates.rate(c.used_epoch, c.used_minibatch)
            self.step(batch)
            steps += 1
            c.used_minibatch += 1
            source.observe(self.strategy.experimental_local_results(batch["position"]))
            position = self._position = min(start + steps * self.config.minibatch_size, stop)
            for monitor in self.monitors:
                monitor.on_step(self._progress(), position)
            if c.used_minibatch % self.config.console_logging_frequency_mb == 0:
                self._log(position)
        bad = source.finish()
        self._check_finite()
        if steps == 0:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"no usable batch in records {start}..{stop - 1} of epoch {c.used_epoch + 1}: "
                f"all {stop - start} images failed to load (they are listed in this file)"))
        return bad

    def _count_bad_images(self, bad: int, stop: int) -> None:
        c = self.counters
        c.epoch_bad_images += bad
        if c.epoch_bad_images > self.config.max_bad_image_fraction * stop:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"{c.epoch_bad_images} of {stop} images in epoch {c.used_epoch + 1} failed to load, more than "
                f"max_bad_image_fraction {self.config.max_bad_image_fraction} of {self.config.config_path}; "
                "fix or remove the images listed in this file, or raise the limit"))

    def _checkpoint(self) -> None:
        logs: dict = {"learning_rate": float(self.optimizer.learning_rate.numpy())}
        for monitor in self.monitors:
            monitor.before_checkpoint(self._progress(), logs)
        saving = time.monotonic()
        path = self._save_checkpoint()
        logs["checkpoint_seconds"] = time.monotonic() - saving
        if self.budget is not None:
            self.budget.checkpoint_took(logs["checkpoint_seconds"])
        for monitor in self.monitors:
            monitor.on_slice_end(self._progress(), path, logs)

    def _another_slice_fits(self) -> bool:
        """--time-limit: whether the next slice and the exports after it end in time (every worker agreeing)."""
        c = self.counters
        fits = self.budget is None or self.budget.another_slice_fits(
            exports=self.schedule.exports_after_slice(c.used_epoch, c.offset))
        if self.worker_sums is not None:
            # A collective: a worker that stopped alone would leave the others waiting in the next step.
            fits = self.worker_sums([0.0 if fits else 1.0])[0] == 0
        return fits

    def _stop_for_time_limit(self) -> Counters:
        """Export what the last checkpoint holds and say how to go on; the next run resumes exactly here."""
        c = self.counters
        export = self.paths.stopped_export(self.config.model)
        self._export(export, "time limit")
        for monitor in self.monitors:
            monitor.on_train_stopped(self._progress())
        budget = self.budget
        notice = budget.too_small_notice(self.config.config_path) if budget is not None else None
        if notice:
            self.echo(notice)
        limit = f" --time-limit {budget.text}" if budget is not None else ""
        elapsed = f" after {format_duration(budget.elapsed())}" if budget is not None else ""
        schedule, again = self.schedule, f"deepdanbooru train-project {shlex.quote(str(self.paths.root))}{limit}"
        self.echo(f"Stopped for the time limit{elapsed} at epoch {c.used_epoch + 1}/{schedule.epoch_count}, "
                  f"record {c.offset}/{schedule.train_records}, step {c.used_minibatch}: "
                  f"{self.manager.latest_checkpoint} and {export.name} are written. To continue from there, "
                  f"run train-project again, e.g. {again}")
        return c

    def _end_epoch(self) -> None:
        c = self.counters
        c.used_epoch += 1
        c.random_seed += 1
        c.offset = 0
        self._position = 0
        c.epoch_bad_images = 0
        logs: dict = {}
        for monitor in self.monitors:
            monitor.on_epoch_end(self._progress(), logs)
        if self.schedule.export_due(c.used_epoch):
            self._export(self.paths.epoch_export(self.config.model, c.used_epoch), "epoch")

    # --- checkpoints, exports, safety ---

    def _check_finite(self) -> None:
        step = self.step.sums.first_bad()
        if step is None:
            return
        last = self.manager.latest_checkpoint
        kept = f"the last good checkpoint {last} is kept" if last else "no checkpoint was written"
        raise TrainingError(file_field(
            self.config.config_path, "learning_rate",
            f"non-finite loss at step {step} (epoch {self.counters.used_epoch + 1}); training stopped and "
            f"{kept}. Lower the learning rate (now {self._rate()}"
            ") or set gradient_clip_norm, then run train-project again"))

    def _save_checkpoint(self) -> str:
        self._check_finite()
        self.state.assign(self.counters, self.identity, self.records_hash)
        path = self.manager.save()
        self._saved = (path, replace(self.counters))
        # Only after TensorFlow has renamed the finished checkpoint into place.
        self._write_mirror(path, complete=False)
        return path

    def _write_mirror(self, checkpoint: str, complete: bool) -> None:
        if not self.role.is_chief:
            return
        write_state_json(self.paths.checkpoints, checkpoint, self.counters, self.identity, complete=complete,
                         epoch_count=self.config.epoch_count, train_records=self.schedule.train_records,
                         records_hash=self.records_hash)

    def _export(self, path: Path, kind: str) -> None:
        if not self.role.is_chief:
            return  # exports read the mirrored weights without collectives: the chief alone writes them
        started = time.monotonic()
        copy = self.paths.float32_copy(path) if self.config.mixed_precision else None
        with self._averaged():
            written = export_model(self.model, path, float32_copy=copy, tags=self.plan.tags)
            if self.validator is not None:
                report = self.validator.for_step(self.counters.used_minibatch) or self._validate("export")
                write_sidecars(path, self.plan.tags, report)
        if self.budget is not None:
            self.budget.export_took(time.monotonic() - started)
        for monitor in self.monitors:
            monitor.on_export(written[0], kind)
            if copy is not None:
                monitor.on_export(written[1], "float32")

    def _validate(self, trigger: str) -> ValidationReport:
        # The best-model monitor exports from on_validation: it must see the weights that were measured.
        with self._averaged():
            report = self.validator.run(self._progress(), trigger)
            if self.budget is not None:
                self.budget.validation_took(report.seconds)
            logs: dict = {}
            for monitor in self.monitors:
                monitor.on_validation(report, logs)
        return report

    def _averaged(self):
        """The weights validation and exports use: the moving average with ema_decay, else the trained ones."""
        return self.ema.swapped() if self.ema is not None else contextlib.nullcontext()

    # --- reporting ---

    def _samples_trained(self) -> int:
        """used_sample now: what earlier processes trained plus what this one's step has counted."""
        return self._base_samples + int(self.step.sums.total_samples.numpy())

    def _progress(self) -> Progress:
        c = self.counters
        return Progress(c.used_epoch, c.used_minibatch, c.used_sample, c.offset, c.random_seed,
                        self.schedule.epoch_count, self.schedule.train_records)

    def _done_records(self, position: int | None = None) -> int:
        c = self.counters
        return self.schedule.done_records(c.used_epoch, c.offset if position is None else position)

    def _log(self, position: int) -> None:
        self._check_finite()
        window = self.step.sums.read_window()
        now = time.monotonic()
        samples = window["samples"]
        elapsed = max(now - self._last_log, 1e-9)
        self._last_log = now
        tp, fp, fn = window["true_positives"], window["false_positives"], window["false_negatives"]
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        eta = self._eta.update(now, self._done_records(position))
        if eta is not None and self.budget is not None:
            eta = min(eta, max(self.budget.seconds - self.budget.elapsed(), 0.0))  # the stop comes first
        progress = replace(self._progress(), used_sample=self._samples_trained())
        log = StepLog(progress=progress, loss=window["loss_sum"] / samples if samples else float("nan"),
                      precision=precision, recall=recall, f1=f1, samples_per_second=samples / elapsed,
                      eta_seconds=eta, fraction=progress.fraction(position),
                      learning_rate=self._rate())
        for monitor in self.monitors:
            monitor.on_step_log(log)

    def _rate(self) -> float:
        """The rate the last step used (warmup_cosine sets it before each step, from the count before it)."""
        c = self.counters
        last = c.used_minibatch - 1 if self.rates.per_minibatch and c.used_minibatch else c.used_minibatch
        return self.rates.rate(c.used_epoch, last)

    def _interrupt_message(self) -> str:
        """Where the run stands, what its last checkpoint holds and that the same command resumes."""
        c, epochs, n = self.counters, self.schedule.epoch_count, self.schedule.train_records
        stands = (f"stopped in epoch {min(c.used_epoch + 1, epochs)} of {epochs} at record {self._position} of "
                  f"{n} (step {c.used_minibatch})")
        if self._saved is None:
            return f"{stands}; no checkpoint was written yet, so running the same command starts fresh"
        path, saved = self._saved
        return (f"{stands}; the last checkpoint {path} holds {describe_resume_point(vars(saved), n, epochs)}; "
                "running the same command resumes from it")

    def _run_info(self) -> RunInfo:
        schedule = self.schedule
        return RunInfo(
            project=self.paths.root, model_name=self.config.model, input_shape=self.config.input_shape,
            batch_size=self.config.minibatch_size, epoch_count=schedule.epoch_count,
            train_records=schedule.train_records, validation_records=len(self.plan.validation),
            slice_records=schedule.slice_records, slices_per_epoch=schedule.slices_per_epoch, policy=self.policy,
            resumed_from=self.latest, start=self._progress(),
            source_model=str(self.plan.source_model) if self.plan.source_model else None,
            validation_fraction=self.config.validation_fraction,
            validation_frequency_slices=schedule.validation_every,
            best_model_metric=self.config.best_model_metric, config_path=self.config.config_path,
            trust_warning=self.plan.trust_warning if self.role.is_chief else None,
            model=self.model)


def train(plan, strategy, monitors, echo=print) -> Counters:
    return SliceTrainer(plan, strategy, monitors, echo).run()
