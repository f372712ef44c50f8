"""The run's checkpoint: what it holds, the latest one of this setup, restoring it, saving and mirroring it.

A checkpoint holds the model, the inner optimizer (its slots and step count), the resume counters and
run identity (training.state.ResumeState), the network and its --source-model (training.network), the
loss scale, the weight average (ema_decay) and every monitor's state, so a run restarted from it
continues bitwise where the saved one was.
"""

from __future__ import annotations

from dataclasses import replace

import keras
import tensorflow as tf

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.runstate.state import Counters, check_identity, write_state_json
from deepdanbooru.training.chief import checkpoint_manager
from deepdanbooru.training.ema import checkpoint_has_average
from deepdanbooru.training.network import NetworkState
from deepdanbooru.training.state import ResumeState, read_checkpoint_state

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


def monitor_state(monitors) -> tf.Module:
    """The monitors' checkpoint_objects under one key, so they never collide with the trainer's own."""
    state = tf.Module(name="monitors")
    for monitor in monitors:
        for name, trackable in monitor.checkpoint_objects().items():
            if hasattr(state, name):
                raise ValueError(f"two monitors save state under the checkpoint key {name!r}")
            setattr(state, name, trackable)
    return state


def latest_checkpoint_of_setup(paths, identity, config_path) -> str | None:
    """The latest checkpoint, refused (one line) when it was written for another model, size or tags."""
    latest = tf.train.latest_checkpoint(str(paths.checkpoints))
    if latest:
        _, saved = read_checkpoint_state(latest)
        check_identity(saved, identity, paths.checkpoints, paths.tags, config_path)
    return latest


# In the name of a variable a restore could not match: it belongs to the optimizer (fused optimizers' scopes,
# the slots of momentum, Adam, RMSprop and LAMB).
OPTIMIZER_STATE_WORDS = ("fused_", "_momentum", "_velocity", "optimizer/", "_average_gradient")


class CheckpointKeeper:
    """Restores the latest checkpoint into the run's objects, saves new ones, mirrors them to state.json."""

    def __init__(self, run, latest: str | None, model, optimizer, inner, ema, monitors, echo=print, start=None,
                 distill=None, anchor=None):
        """`start`: training.wise.StartWeights (wise_ft, source_distillation, training.anchor's keys), `distill`:
        training.distill's Distillation, `anchor`: training.anchor's SourceAnchor, each kept in every checkpoint
        (None: off)."""
        self.run, self.latest, self.ema, self.echo = run, latest, ema, echo
        self.state = ResumeState()
        self.core = dict(model=model, optimizer=inner, state=self.state, loss_scale=LossScaleState(optimizer))
        if ema is not None:
            self.core["ema"] = ema.state
        if start is not None:
            self.core["start_weights"] = start.state
        if distill is not None:
            self.core["source_distillation"] = distill.state
        if anchor is not None:
            self.core["source_anchor"] = anchor.state
        # The network record is not core: a checkpoint written before it existed still resumes.
        self.checkpoint = tf.train.Checkpoint(**self.core, network=NetworkState(run.network),
                                              monitors=monitor_state(monitors))
        # Only the chief writes checkpoints; a worker's manager only counts them.
        self.manager = checkpoint_manager(self.checkpoint, run.paths.checkpoints, run.role, latest,
                                          model.variables + optimizer.variables, KEEP_CHECKPOINTS)
        self.saved: tuple[str, Counters] | None = None  # (path, counters) of the latest checkpoint, when known

    def track_window(self, sums) -> None:
        """Keep the step's sums since the last console line (training.step.StepSums.WINDOW) in every checkpoint, so
        the first line after a resume averages the steps an uninterrupted run's does. Added after the restore:
        TensorFlow restores them now, from a checkpoint that holds them (an older one leaves them at zero)."""
        window = tf.Module(name="window")
        for name in sums.WINDOW:
            setattr(window, name, getattr(sums, name))
        self.checkpoint.window = window

    @property
    def latest_checkpoint(self) -> str | None:
        return self.manager.latest_checkpoint

    def restore(self) -> Counters:
        """The counters of the latest checkpoint, its weights and state restored in place (fresh: zeros)."""
        if not self.latest:
            return Counters()
        core = self.core
        saved_average = checkpoint_has_average(self.latest)
        fresh_average = self.ema is not None and not saved_average
        if fresh_average:
            # Written before ema_decay was set: the rest must match; the average then starts at those weights.
            core = {key: value for key, value in core.items() if key != "ema"}
        try:
            status = self.checkpoint.restore(self.latest)
            # What this run does not use is left unread without a warning line per value: a saved weight average
            # when ema_decay is off, the state of a monitor this run does not have (a worker has none; validation
            # or best-model export may have been switched off). What the run does use is checked below.
            status.expect_partial()
            try:
                status.assert_existing_objects_matched()
            except AssertionError:
                # Monitor state (e.g. the best-so-far value) may predate this checkpoint; only the core must match.
                tf.train.Checkpoint(**core).read(self.latest).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            if any(word in reason for word in OPTIMIZER_STATE_WORDS):
                raise TrainingError(file_field(
                    self.latest, None,
                    f"the optimizer's saved state does not fit ({reason}): {self.run.config.config_path}'s "
                    "optimizer (or a setting that shapes its state, such as momentum) is not the one it was saved "
                    f"with; restore it to resume, or delete {self.run.paths.checkpoints} to start fresh")) from None
            raise TrainingError(file_field(
                self.latest, None,
                f"does not fit the model being trained ({reason}); resume with the same model "
                f"(and --source-model) it was saved with, or delete {self.run.paths.checkpoints} to start fresh"
            )) from None
        if fresh_average:
            self.ema.reset()
            self.echo(f"notice: {self.latest} holds no weight average; ema_decay starts it at the restored weights")
        counters = self.state.counters()
        saved_records = self.state.records_hash.numpy().decode()
        if saved_records and saved_records != self.run.records_hash and counters.offset:
            records = self.run.schedule.train_records
            if counters.offset >= records:
                self.echo(f"notice: the training records changed since {self.latest}; the epoch in progress "
                          f"had reached offset {counters.offset}, past the {records:,} records an epoch now "
                          "holds, so it counts as finished and the next one starts")
            else:
                self.echo(f"notice: the training records changed since {self.latest}; the current epoch "
                          f"continues at offset {counters.offset} of the new order, so some records of this "
                          "epoch may be seen twice or not at all")
        self.saved = (self.latest, replace(counters))
        return counters

    def save(self, counters: Counters) -> str:
        self.state.assign(counters, self.run.identity, self.run.records_hash)
        path = self.manager.save()
        self.saved = (path, replace(counters))
        # Only after TensorFlow has renamed the finished checkpoint into place.
        self.write_mirror(path, counters, complete=False)
        return path

    def write_mirror(self, checkpoint: str, counters: Counters, complete: bool) -> None:
        """checkpoints/state.json: the counters for tools that do not start TensorFlow (the chief writes it)."""
        run = self.run
        if not run.role.is_chief:
            return
        write_state_json(run.paths.checkpoints, checkpoint, counters, run.identity, complete=complete,
                         epoch_count=run.schedule.epoch_count, train_records=run.schedule.train_records,
                         records_hash=run.records_hash, network=run.network.mirror(),
                         split={"validation_fraction": run.config.validation_fraction, "seed": run.config.seed})
