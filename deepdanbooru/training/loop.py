"""The slice loop: train, checkpoint, resume, export (docs/training.md).

    (a fresh run from --source-model: validate the starting weights at step 0, training.start)
    while used_epoch < epoch_count:
        order = permutation(train records, seed=(seed, random_seed))
        learning rate = schedule(used_epoch); trunk frozen or not (freeze_backbone_epochs)
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

SliceTrainer composes the parts, each with one job: making the model
(training.making), the checkpoint (training.checkpointing), the frozen trunk
(training.freeze), one slice's steps (training.slices), validation and exports
(training.outputs), what the run prints (training.reporting), what a fine-tune keeps of its
source (training.keeping).
"""

from __future__ import annotations

import contextlib
import time

import keras
import tensorflow as tf

from deepdanbooru.compiling import prepare_for_xla
from deepdanbooru.errors import Interrupted, TrainingError, file_field
from deepdanbooru.models import make_optimizer
from deepdanbooru.models.losses import project_loss
from deepdanbooru.models.optimizers import decay_exempt, layer_rate_factors
from deepdanbooru.models.partial import partial_training
from deepdanbooru.models.precision import MIXED, choose_policy
from deepdanbooru.project.tags import tags_hash
from deepdanbooru.runstate.state import Counters, RunIdentity
from deepdanbooru.scoring.split import records_hash
from deepdanbooru.training.checkpointing import CheckpointKeeper, latest_checkpoint_of_setup
from deepdanbooru.training.ema import WeightAverage
from deepdanbooru.training.fit_monitor import FitMonitor
from deepdanbooru.training.freeze import BackboneFreeze
from deepdanbooru.training.making import Priors, make_model, network_label
from deepdanbooru.training.network import Network, export_name, recorded_network
from deepdanbooru.training.outputs import Outputs
from deepdanbooru.training.reporting import RunReport
from deepdanbooru.training.schedule import LearningRateSchedule, Schedule
from deepdanbooru.training.sharding import (agree_with_the_other_workers, every_worker_agrees, leave_together,
                                            setup_fingerprints)
from deepdanbooru.training.slices import SliceRunner
from deepdanbooru.training.source import claim_project
from deepdanbooru.training.start import measure_start
from deepdanbooru.training.step import TrainStep, build_optimizer
from deepdanbooru.training.strategy import check_global_batch, describe_strategy, synchronize_batch_norm
from deepdanbooru.training.keeping import start_weights


def _enable_determinism(seed: int) -> None:
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def make_training_optimizer(config, model, policy: str, rate: float):
    """(optimizer to step with, inner optimizer whose state is checkpointed), built for every variable of
    `model` before any restore, so every slot exists and the restore fills it in place."""
    optimizer, inner = build_optimizer(
        # The inner optimizer clips, i.e. after the loss-scale optimizer has unscaled the gradients.
        lambda: make_optimizer(config.optimizer, rate, global_clipnorm=config.gradient_clip_norm,
                               weight_decay=config.decay, decay_exempt_variables=decay_exempt(model, config.model),
                               rate_factors=layer_rate_factors(model, config.model, config.layer_decay,
                                                               config.config_path)),
        policy == MIXED)
    optimizer.build(model.trainable_variables)
    return optimizer, inner


class SliceTrainer:
    """One train-project run: the parts, built in the order TensorFlow needs, and the loop over them.

    The strategy exists already (train.py chose it before anything started
    TensorFlow's runtime), then the model and optimizer are created in its
    scope, then the checkpoint is restored into them, then the step is
    compiled around them.
    """

    def __init__(self, plan, strategy, monitors, echo=print):
        self.plan, self.config, self.paths = plan, plan.config, plan.paths
        self.strategy, self.role = strategy, plan.role
        self.monitors = list(monitors)
        self.echo = echo
        self.schedule = Schedule.from_config(self.config, len(plan.train))
        # The learning rate per epoch (steps) or per minibatch (warmup_cosine).
        self.rates = LearningRateSchedule(self.config, len(plan.train))
        # epoch_count "fit": the epoch count of both schedules, planned once this run has timed a slice.
        self.fit = FitMonitor.for_run(plan, self.schedule, self.rates, echo)
        self.monitors += [self.fit] if self.fit is not None else []
        priors = Priors(plan)

        check_global_batch(strategy, self.config.minibatch_size, self.config.config_path)
        echo(describe_strategy(strategy, self.role, self.config.minibatch_size))
        _enable_determinism(self.config.seed)
        self.policy = choose_policy(self.config.mixed_precision, plan.force_mixed_precision, echo)
        self.identity = RunIdentity(self.config.model, self.config.image_height, self.config.image_width,
                                    tags_hash(plan.tags), len(plan.tags), self.config.trainable_blocks)
        self.records_hash = records_hash(plan.train)
        self.latest = latest_checkpoint_of_setup(self.paths, self.identity, self.config.config_path)
        recorded = recorded_network(self.latest, plan.source_model, self.paths.checkpoints)
        with strategy.scope():
            self.model = make_model(plan, self.policy, priors, bool(self.latest), echo,
                                    write_report=self.role.is_chief, recorded=recorded)
            # Before the optimizer is built: the frozen part gets no slots.
            self.partial = partial_training(self.model, self.config.model, self.config.trainable_blocks,
                                            self.config.config_path, network_label(plan, recorded, self.model))
            if self.partial is not None:
                self.partial.freeze()
                echo(self.partial.describe())
            self.optimizer, inner = make_training_optimizer(self.config, self.model, self.policy,
                                                            self.rates.rate(0, 0))
            self.ema = WeightAverage(self.model, self.config.ema_decay, self.partial.frozen if self.partial else ()) \
                if self.config.ema_decay else None
            self.start, self.distill, anchor = start_weights(plan, self.model, inner, self.partial, self.latest,
                                                             recorded, echo)
        if self.role.is_chief:
            # Only once the model is made: a --source-model refused there leaves the project as it was.
            claim_project(plan, self.latest)
        synchronize_batch_norm(self.model, strategy)
        self.jit_compile = prepare_for_xla(self.config.jit_compile, self.model, strategy.num_replicas_in_sync, echo)
        # What every checkpoint records and every line names: the network that trains, and its source.
        source = recorded.source if recorded else plan.source_model
        self.exports = export_name(self.config.model, self.model, source, self.latest)
        with self.partial.thawed() if self.partial is not None else contextlib.nullcontext():
            self.network = Network.of(self.model, source, self.exports)
        if self.exports != self.config.model:
            echo(f"Exports: {self.paths.final_export(self.exports).name} and the others of its name, after the "
                 f"network that trains (project.json's model {self.config.model} names runs from the model table)")
        self.keeper = CheckpointKeeper(self, self.latest, self.model, self.optimizer, inner, self.ema,
                                       self.monitors, echo, start=self.start, distill=self.distill, anchor=anchor)
        restoring = time.monotonic()
        self.counters = self.keeper.restore()
        restore_seconds = time.monotonic() - restoring
        if self.distill is not None:
            self.distill.load()
        self.worker_sums = agree_with_the_other_workers(strategy, self.role, setup_fingerprints(
            self.config, self.identity, self.records_hash, self.counters, self.latest))
        if self.fit is not None:
            self.fit.resume(self.counters, restore_seconds, self.worker_sums)
        self.step = TrainStep(strategy, self.model, self.optimizer,
                              project_loss(self.config, "none", priors.loss_weights()),
                              loss_scaled=self.policy == MIXED, ema=self.ema, jit_compile=self.jit_compile,
                              echo=echo, distill=self.distill)
        self.step.sums.step.assign(self.counters.used_minibatch)
        self.keeper.track_window(self.step.sums)
        self.freeze = BackboneFreeze(self.model, inner, self.config.freeze_backbone_epochs,
                                     on_change=self.step.retrace, echo=echo,
                                     trains=f"trainable_blocks' {self.partial.part()}" if self.partial else "every layer")
        self.budget = plan.time_budget
        self.report = RunReport(plan, self.schedule, self.rates, self.counters, self.step.sums, self.monitors)
        wise = self.start if self.start is not None and self.start.alphas else None
        self.outputs = Outputs(plan, self.model, self.ema, self.monitors, self.jit_compile, echo, wise=wise)
        if wise is not None and self.budget is not None:
            self.budget.final_validations = len(wise.alphas)
        self.slices = SliceRunner(plan, strategy, self.worker_sums, self.step, self.optimizer, self.rates,
                                  self.counters, self.report, self.monitors, self._check_finite)

    def run(self) -> Counters:
        try:
            return self._run()
        except KeyboardInterrupt:
            for monitor in self.monitors:
                monitor.on_interrupted(self.report.progress())
            raise Interrupted(self.report.interrupt_message(self.keeper.saved)) from None
        finally:
            for monitor in self.monitors:
                monitor.close()

    def _run(self) -> Counters:
        c, schedule, report = self.counters, self.schedule, self.report
        for monitor in self.monitors:
            monitor.on_train_begin(report.run_info(self.model, self.policy, self.latest, self.network))
        if schedule.trained_out(c.used_epoch, c.offset):
            self.echo(already_complete(schedule, c, self.config.config_path))
            if c.used_epoch >= schedule.epoch_count and c.offset >= schedule.train_records:
                c.next_epoch()  # epoch_count was lowered: the epoch the last checkpoint finished counts
                self.report.position = 0
        if not self.latest:
            # A fine-tune's history and best model start where the source stands (training.start).
            measure_start(self.plan, self.outputs, report.progress(), self.echo)
        while c.used_epoch < schedule.epoch_count:
            order = schedule.order(c.random_seed)
            self.optimizer.learning_rate = self.rates.rate(c.used_epoch, c.used_minibatch)
            self.freeze.at_epoch(c.used_epoch, c.offset)
            while c.offset < schedule.train_records:
                if not self._another_slice_fits():
                    return self._stop_for_time_limit()
                started = time.monotonic()
                stop = schedule.slice_stop(c.offset)
                self.slices.train(order, c.offset, stop)
                c.used_sample = report.samples_trained()
                c.offset = stop
                # Before the checkpoint, so what validation changes (best-so-far value, history) is saved with it.
                trigger = schedule.validation_after(stop)
                if trigger:
                    self.outputs.validate(report.progress(), trigger)
                self._checkpoint()
                if self.budget is not None:
                    self.budget.slice_took(time.monotonic() - started)
            self._end_epoch()
        leave_together(self.worker_sums)  # only the chief exports after this
        self.outputs.export(self.paths.final_export(self.exports), "final", report.progress())
        # No checkpoint here: it would repeat the last slice's at the cost of a full save. The mirror
        # records the counters after the epoch end, for preflight to say that training is complete.
        if self.keeper.latest_checkpoint:
            self.keeper.write_mirror(self.keeper.latest_checkpoint, c, complete=True)
        for monitor in self.monitors:
            monitor.on_train_end(report.progress())
        return c

    def _checkpoint(self) -> None:
        progress = self.report.progress()
        logs: dict = {"learning_rate": float(self.optimizer.learning_rate.numpy())}
        for monitor in self.monitors:
            monitor.before_checkpoint(progress, logs)
        saving = time.monotonic()
        path = self.save_checkpoint()
        logs["checkpoint_seconds"] = time.monotonic() - saving
        if self.budget is not None:
            self.budget.checkpoint_took(logs["checkpoint_seconds"])
        for monitor in self.monitors:
            monitor.on_slice_end(progress, path, logs)

    def save_checkpoint(self) -> str:
        self._check_finite()
        return self.keeper.save(self.counters)

    def _another_slice_fits(self) -> bool:
        """--time-limit: whether the next slice and the exports after it end in time (every worker agreeing)."""
        c = self.counters
        fits = self.budget is None or self.budget.another_slice_fits(
            exports=self.schedule.exports_after_slice(c.used_epoch, c.offset))
        # A worker that stopped alone would leave the others waiting in the next step.
        return every_worker_agrees(self.worker_sums, fits)

    def _stop_for_time_limit(self) -> Counters:
        """Export what the last checkpoint holds and say how to go on; the next run resumes exactly here."""
        leave_together(self.worker_sums)  # only the chief exports after this
        export = self.paths.stopped_export(self.exports)
        self.outputs.export(export, "time limit", self.report.progress())
        for monitor in self.monitors:
            monitor.on_train_stopped(self.report.progress())
        notice = self.budget.too_small_notice(self.config.config_path) if self.budget is not None else None
        if notice:
            self.echo(notice)
        self.echo(self.report.time_limit_message(self.keeper.latest_checkpoint, export))
        return self.counters

    def _end_epoch(self) -> None:
        c = self.counters
        c.next_epoch()
        self.report.position = 0
        logs: dict = {}
        for monitor in self.monitors:
            monitor.on_epoch_end(self.report.progress(), logs)
        if self.schedule.export_due(c.used_epoch):
            self.outputs.export(self.paths.epoch_export(self.exports, c.used_epoch), "epoch",
                                self.report.progress())

    def _check_finite(self) -> None:
        step = self.step.sums.first_bad()
        if step is None:
            return
        raise non_finite_error(self.config.config_path, step, self.counters.used_epoch, self.report.rate(),
                               self.keeper.latest_checkpoint)


def non_finite_error(config_path, step: int, used_epoch: int, rate, last_checkpoint) -> TrainingError:
    kept = f"the last good checkpoint {last_checkpoint} is kept" if last_checkpoint else "no checkpoint was written"
    return TrainingError(file_field(
        config_path, "learning_rate",
        f"non-finite loss at step {step} (epoch {used_epoch + 1}); training stopped and {kept}. Lower the "
        f"learning rate (now {rate}) or set gradient_clip_norm, then run train-project again"))


def already_complete(schedule, counters, config_path) -> str:
    """What a run over a project trained to its epoch_count (or past it, the count lowered since) says."""
    trained = counters.used_epoch + (counters.offset >= schedule.train_records)
    begun = counters.used_epoch >= schedule.epoch_count and 0 < counters.offset < schedule.train_records
    if trained > schedule.epoch_count or begun:
        held = f"{trained} epochs" + (f" and {counters.offset} records of epoch {trained + 1}" if begun else "")
        return (f"Training already complete: {held} trained, more than epoch_count {schedule.epoch_count} in "
                f"{config_path}; writing the exports of those weights again (a shorter run needs a new project)")
    return (f"Training already complete ({schedule.epoch_count} of {schedule.epoch_count} epochs); writing the "
            f"exports again. Raise epoch_count in {config_path} to train further")


def train(plan, strategy, monitors, echo=print) -> Counters:
    return SliceTrainer(plan, strategy, monitors, echo).run()
