"""The slice loop of SPEC section 5: train, checkpoint, resume, export.

    while used_epoch < epoch_count:
        order = permutation(train records, seed=(seed, random_seed))
        learning rate = schedule(used_epoch)
        while offset < len(records):
            train on order[offset : offset + checkpoint_frequency_mb * minibatch_size]
            offset += slice length; checkpoint (latest 3 kept); mirror to state.json
        used_epoch += 1; random_seed += 1; offset = 0; export when due
    export the final model

Every random choice is a function of (seed, random_seed, position), the
checkpoint holds every counter next to the weights and optimizer, and each
slice is batched on its own, so a run restarted from any checkpoint forms the
same batches with the same augmentation as a run that never stopped.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from deepdanbooru.errors import Interrupted, ModelError, TrainingError, file_field
from deepdanbooru.models import build_model, load_model_file, make_optimizer
from deepdanbooru.project.resume import describe_resume_point
from deepdanbooru.project.tags import tags_hash
from deepdanbooru.training.chief import checkpoint_manager
from deepdanbooru.training.export import export_model
from deepdanbooru.training.monitors import Eta, Progress, RunInfo, StepLog, ValidationReport, validation_trigger
from deepdanbooru.training.precision import MIXED, choose_policy, global_policy, with_policy
from deepdanbooru.training.state import (
    Counters,
    ResumeState,
    RunIdentity,
    check_identity,
    read_checkpoint_state,
    write_state_json,
)
from deepdanbooru.training.split import records_hash
from deepdanbooru.training.sharding import WorkerSums, check_same_setup, distribute_slice, setup_fingerprints
from deepdanbooru.training.step import TrainStep, build_optimizer
from deepdanbooru.training.strategy import (
    check_global_batch,
    choose_strategy,
    describe_strategy,
    synchronize_batch_norm,
)
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


def _check_model_shapes(model, plan, source) -> None:
    expected_input = (None, *plan.config.input_shape)
    if tuple(model.input_shape) != expected_input:
        raise ModelError(file_field(source, "input", f"model input is {tuple(model.input_shape)[1:]}, but "
                                    f"{plan.config.config_path} asks for (height, width, 3) = "
                                    f"{plan.config.input_shape}"))
    output = tuple(model.output_shape)
    if len(output) != 2 or output[1] != len(plan.tags):
        raise ModelError(file_field(source, "output", f"model output is {output[1:]}, but {plan.paths.tags} "
                                    f"has {len(plan.tags)} tags; the output width must equal the tag count"))


def _make_model(plan, policy: str) -> keras.Model:
    """Call inside the strategy scope: every variable must be created there."""
    config = plan.config
    if plan.source_model is None:
        with global_policy(policy):
            return build_model(config.model, config.input_shape, len(plan.tags), seed=config.seed)
    # Loaded outside our control (maybe compiled, maybe another policy): rebuild uncompiled under ours.
    loaded = load_model_file(plan.source_model)
    _check_model_shapes(loaded, plan, plan.source_model)
    return with_policy(loaded, policy)


def _epoch_order(n: int, seed: int, random_seed: int) -> np.ndarray:
    return np.random.default_rng([seed, random_seed]).permutation(n)


class SliceTrainer:
    """Owns model, optimizer, checkpoint and counters for one train-project run."""

    def __init__(self, plan, monitors, echo=print):
        self.plan = plan
        self.config = plan.config
        self.paths = plan.paths
        self.monitors = list(monitors)
        self.echo = echo
        self.train = plan.train
        self.n = len(plan.train)
        self.slice_records = self.config.checkpoint_frequency_mb * self.config.minibatch_size
        self.train_paths = self.train.paths()

        self.role = plan.role
        # First of all: collectives and logical devices cannot be configured once TensorFlow's runtime runs.
        self.strategy = choose_strategy(plan.devices, self.role)
        check_global_batch(self.strategy, self.config.minibatch_size, self.config.config_path)
        echo(describe_strategy(self.strategy, self.role, self.config.minibatch_size))
        _enable_determinism(self.config.seed)
        self.policy = choose_policy(self.config.mixed_precision, plan.force_mixed_precision, echo)
        self.identity = RunIdentity(self.config.model, self.config.image_height, self.config.image_width,
                                    tags_hash(plan.tags), len(plan.tags))
        self.records_hash = records_hash(self.train)

        self.latest = tf.train.latest_checkpoint(str(self.paths.checkpoints))
        if self.latest:
            _, saved = read_checkpoint_state(self.latest)
            check_identity(saved, self.identity, self.paths.checkpoints, self.paths.tags, self.config.config_path)

        with self.strategy.scope():
            self.model = _make_model(plan, self.policy)
            rate = self.config.learning_rate_for_epoch(0)
            self.optimizer, inner = build_optimizer(
                # The inner optimizer clips, i.e. after the loss-scale optimizer has unscaled the gradients.
                lambda: make_optimizer(self.config.optimizer, rate, global_clipnorm=self.config.gradient_clip_norm),
                self.policy == MIXED)
            # Built before any restore, so every slot exists and the restore fills it in place.
            self.optimizer.build(self.model.trainable_variables)
        synchronize_batch_norm(self.model, self.strategy)
        self.state = ResumeState()
        self._core = dict(model=self.model, optimizer=inner, state=self.state,
                          loss_scale=LossScaleState(self.optimizer))
        self.checkpoint = tf.train.Checkpoint(**self._core, monitors=_monitor_state(self.monitors))
        # Only the chief writes checkpoints; a worker's manager only counts them.
        self.manager = checkpoint_manager(self.checkpoint, self.paths.checkpoints, self.role, self.latest,
                                          self.model.variables + self.optimizer.variables, KEEP_CHECKPOINTS)
        self.counters = self._restore()
        # What the latest checkpoint holds, for the interrupt message: (path, counters) or None.
        self._saved = (self.latest, replace(self.counters)) if self.latest else None
        self._position = self.counters.offset  # records of the current epoch handed to the model
        self.sums = WorkerSums(self.strategy) if self.role.in_cluster else None
        if self.sums is not None:
            check_same_setup(self.sums, self.role, setup_fingerprints(
                self.config, self.identity, self.records_hash, self.counters, self.latest))
        # used_sample at the start of this process; the step's counter adds what this process trains.
        self._base_samples = self.counters.used_sample
        self.step = TrainStep(self.strategy, self.model, self.optimizer, self.config.loss,
                              loss_scaled=self.policy == MIXED)
        self.step.counters.step.assign(self.counters.used_minibatch)
        # Validation writes reports and exports: the chief's job in a cluster.
        self.validator = Validator(self.model, plan.validation, plan.tags, self.config, self.paths.bad_images) \
            if len(plan.validation) and self.role.is_chief else None
        self._last_log = time.monotonic()
        self._eta = Eta(self.config.epoch_count * self.n)

    # --- resume ---

    def _restore(self) -> Counters:
        if not self.latest:
            return Counters()
        try:
            status = self.checkpoint.restore(self.latest)
            if not self.role.is_chief:
                status.expect_partial()  # a worker has no monitors: their saved state is the chief's alone
            try:
                status.assert_existing_objects_matched()
            except AssertionError:
                # Monitor state (e.g. the best-so-far value) may predate this checkpoint; only the core must match.
                tf.train.Checkpoint(**self._core).read(self.latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            raise TrainingError(file_field(
                self.latest, None,
                f"does not fit the model being trained ({reason}); resume with the same model "
                f"(and --source-model) it was saved with, or delete {self.paths.checkpoints} to start fresh"
            )) from None
        counters = self.state.counters()
        saved_records = self.state.records_hash.numpy().decode()
        if saved_records and saved_records != self.records_hash and counters.offset:
            self.echo(f"notice: the training records changed since {self.latest}; the current epoch "
                      f"continues at offset {counters.offset} of the new order, so some records of this "
                      "epoch may be seen twice or not at all")
        return counters

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
        c = self.counters
        for monitor in self.monitors:
            monitor.on_train_begin(self._run_info())
        epochs = self.config.epoch_count
        if c.used_epoch >= epochs or (c.used_epoch == epochs - 1 and c.offset >= self.n):
            # The last checkpoint of a run is its last slice's: only the epoch end and exports are left.
            self.echo(f"Training already complete ({epochs} of {epochs} epochs); writing the exports again. "
                      f"Raise epoch_count in {self.config.config_path} to train further")
        while c.used_epoch < epochs:
            order = _epoch_order(self.n, self.config.seed, c.random_seed)
            self.optimizer.learning_rate = self.config.learning_rate_for_epoch(c.used_epoch)
            while c.offset < self.n:
                self._train_slice(order)
            self._end_epoch()
        self._export(self.paths.final_export(self.config.model), "final")
        # No checkpoint here: it would repeat the last slice's at the cost of a full save. The mirror
        # records the counters after the epoch end, for preflight to say that training is complete.
        if self.manager.latest_checkpoint:
            self._write_mirror(self.manager.latest_checkpoint, complete=True)
        for monitor in self.monitors:
            monitor.on_train_end(self._progress())
        return c

    def _train_slice(self, order: np.ndarray) -> None:
        c = self.counters
        start = c.offset
        stop = min(start + self.slice_records, self.n)
        slice_data, distributed = distribute_slice(
            self.strategy, self.role, self.sums, self.config, self.plan.tags, self.train_paths,
            self.train.tag_strings, order, start=start, stop=stop, random_seed=c.random_seed,
            epoch=c.used_epoch + 1, bad_image_log=self.paths.bad_images)
        self.step.bind(distributed.element_spec)
        steps = 0
        for batch in distributed:
            self.step(batch)
            steps += 1
            c.used_minibatch += 1
            slice_data.observe(self.strategy.experimental_local_results(batch["position"]))
            position = self._position = min(start + steps * self.config.minibatch_size, stop)
            for monitor in self.monitors:
                monitor.on_step(self._progress(), position)
            if c.used_minibatch % self.config.console_logging_frequency_mb == 0:
                self._log(position)
        bad = slice_data.finish()
        self._check_finite()
        if steps == 0:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"no usable batch in records {start}..{stop - 1} of epoch {c.used_epoch + 1}: "
                f"all {stop - start} images failed to load (they are listed in this file)"))
        c.epoch_bad_images += bad
        if c.epoch_bad_images > self.config.max_bad_image_fraction * stop:
            raise TrainingError(file_field(
                self.paths.bad_images, None,
                f"{c.epoch_bad_images} of {stop} images in epoch {c.used_epoch + 1} failed to load, more than "
                f"max_bad_image_fraction {self.config.max_bad_image_fraction} of {self.config.config_path}; "
                "fix or remove the images listed in this file, or raise the limit"))
        c.used_sample = self._base_samples + int(self.step.counters.total_samples.numpy())
        c.offset = stop
        # Before the checkpoint, so what validation changes (best-so-far value, history) is saved with it.
        if self.validator is not None:
            trigger = validation_trigger(-(-stop // self.slice_records), stop >= self.n,
                                         self.config.validation_frequency_slices)
            if trigger:
                self._validate(trigger)
        logs: dict = {}
        for monitor in self.monitors:
            monitor.before_checkpoint(self._progress(), logs)
        saving = time.monotonic()
        path = self._save_checkpoint()
        logs["checkpoint_seconds"] = time.monotonic() - saving
        for monitor in self.monitors:
            monitor.on_slice_end(self._progress(), path, logs)

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
        every = self.config.export_model_per_epoch
        if every == 0 or c.used_epoch % every == 0:
            self._export(self.paths.epoch_export(self.config.model, c.used_epoch), "epoch")

    # --- checkpoints, exports, safety ---

    def _check_finite(self) -> None:
        step = self.step.counters.first_bad()
        if step is None:
            return
        last = self.manager.latest_checkpoint
        kept = f"the last good checkpoint {last} is kept" if last else "no checkpoint was written"
        raise TrainingError(file_field(
            self.config.config_path, "learning_rate",
            f"non-finite loss at step {step} (epoch {self.counters.used_epoch + 1}); training stopped and "
            f"{kept}. Lower the learning rate (now {self.config.learning_rate_for_epoch(self.counters.used_epoch)}"
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
                         epoch_count=self.config.epoch_count, train_records=self.n, records_hash=self.records_hash)

    def _export(self, path: Path, kind: str) -> None:
        if not self.role.is_chief:
            return  # exports read the mirrored weights without collectives: the chief alone writes them
        copy = self.paths.float32_copy(path) if self.config.mixed_precision else None
        written = export_model(self.model, path, float32_copy=copy)
        if self.validator is not None:
            report = self.validator.for_step(self.counters.used_minibatch) or self._validate("export")
            write_sidecars(path, self.plan.tags, report)
        for monitor in self.monitors:
            monitor.on_export(written[0], kind)
            if copy is not None:
                monitor.on_export(written[1], "float32")

    def _validate(self, trigger: str) -> ValidationReport:
        report = self.validator.run(self._progress(), trigger)
        logs: dict = {}
        for monitor in self.monitors:
            monitor.on_validation(report, logs)
        return report

    # --- reporting ---

    def _progress(self) -> Progress:
        c = self.counters
        return Progress(c.used_epoch, c.used_minibatch, c.used_sample, c.offset, c.random_seed,
                        self.config.epoch_count, self.n)

    def _done_records(self, position: int | None = None) -> int:
        c = self.counters
        return c.used_epoch * self.n + (c.offset if position is None else position)

    def _log(self, position: int) -> None:
        self._check_finite()
        window = self.step.counters.read_window()
        now = time.monotonic()
        samples = window["samples"]
        elapsed = max(now - self._last_log, 1e-9)
        self._last_log = now
        tp, fp, fn = window["true_positives"], window["false_positives"], window["false_negatives"]
        precision = tp / (tp + fp) if tp + fp else 0.0
        recall = tp / (tp + fn) if tp + fn else 0.0
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        eta = self._eta.update(now, self._done_records(position))
        progress = replace(self._progress(), used_sample=self._base_samples
                           + int(self.step.counters.total_samples.numpy()))
        log = StepLog(progress=progress, loss=window["loss_sum"] / samples if samples else float("nan"),
                      precision=precision, recall=recall, f1=f1, samples_per_second=samples / elapsed,
                      eta_seconds=eta, fraction=progress.fraction(position),
                      learning_rate=self.config.learning_rate_for_epoch(progress.used_epoch))
        for monitor in self.monitors:
            monitor.on_step_log(log)

    def _interrupt_message(self) -> str:
        """Where the run stands, what its last checkpoint holds and that the same command resumes."""
        c, epochs = self.counters, self.config.epoch_count
        stands = (f"stopped in epoch {min(c.used_epoch + 1, epochs)} of {epochs} at record {self._position} of "
                  f"{self.n} (step {c.used_minibatch})")
        if self._saved is None:
            return f"{stands}; no checkpoint was written yet, so running the same command starts fresh"
        path, saved = self._saved
        return (f"{stands}; the last checkpoint {path} holds {describe_resume_point(vars(saved), self.n, epochs)}; "
                "running the same command resumes from it")

    def _run_info(self) -> RunInfo:
        slices = -(-self.n // self.slice_records)
        return RunInfo(
            project=self.paths.root, model_name=self.config.model, input_shape=self.config.input_shape,
            batch_size=self.config.minibatch_size, epoch_count=self.config.epoch_count,
            train_records=self.n, validation_records=len(self.plan.validation),
            slice_records=self.slice_records, slices_per_epoch=slices, policy=self.policy,
            resumed_from=self.latest, start=self._progress(),
            source_model=str(self.plan.source_model) if self.plan.source_model else None,
            validation_fraction=self.config.validation_fraction,
            validation_frequency_slices=self.config.validation_frequency_slices,
            best_model_metric=self.config.best_model_metric, config_path=self.config.config_path,
            trust_warning=self.plan.trust_warning if self.role.is_chief else None,
            extras={"model": self.model, "optimizer": self.optimizer, "strategy": self.strategy, "plan": self.plan})


def _monitor_state(monitors) -> tf.Module:
    """The monitors' checkpoint_objects under one key, so they never collide with the trainer's own."""
    state = tf.Module(name="monitors")
    for monitor in monitors:
        for name, trackable in monitor.checkpoint_objects().items():
            if hasattr(state, name):
                raise ValueError(f"two monitors save state under the checkpoint key {name!r}")
            setattr(state, name, trackable)
    return state


def train(plan, monitors, echo=print) -> Counters:
    return SliceTrainer(plan, monitors, echo).run()
