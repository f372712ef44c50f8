"""epoch_count "fit" inside a run: the plan kept in every checkpoint, made before the run's first two.

See training/fit.py for what is measured and how the epochs are planned.
"""

from __future__ import annotations

import math

import tensorflow as tf

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.project.config import FIT
from deepdanbooru.runstate.state import read_state_json
from deepdanbooru.training.budget import EXPORT_PER_CHECKPOINT
from deepdanbooru.training.fit import EpochCosts, StepClock, plan_epochs, plan_line
from deepdanbooru.training.monitors import Monitor


class FitMonitor(Monitor):
    """Sets the run's epoch count (Schedule and LearningRateSchedule) to the plan in force.

    A run plans before the checkpoint of its first slice, from the speed of its
    steps, and again before that of its second, from that slice's whole time
    (the start of its input included, no tracing) and the first checkpoint's.

    Until a run plans, that is the plan of the checkpoint it resumed from (of
    one written while epoch_count was a number: that number); a fresh run has
    none: its schedule ends with the epoch in progress and its cosine has not
    begun. The plan is a checkpoint object, so a run resumed from any
    checkpoint trains on with the plan that checkpoint's run had.
    """

    def __init__(self, plan, schedule, rates, echo=print):
        self.config, self.budget, self.echo, self.paths = plan.config, plan.time_budget, echo, plan.paths
        if self.budget is None:
            plan.config.require_epoch_count(None)
        self.schedule, self.rates = schedule, rates
        self.validation_records = len(plan.validation)
        # Outside any strategy scope: a host-side value the loop assigns, as the resume counters.
        self.planned = tf.Variable(0, dtype=tf.int64, trainable=False, name="planned_epochs")
        # Where the plan in force took over and how far the decay was there (schedule.LearningRateSchedule.anchor);
        # a unit below 0: none (the plain schedule, also from a checkpoint written before the anchor was kept).
        self.anchor = tf.Variable([-1.0, 0.0], dtype=tf.float64, trainable=False, name="schedule_anchor")
        self.clock = StepClock()
        self.restore_seconds, self.worker_sums, self.resumed_plan, self.plans_left = 0.0, None, 0, 2
        self.apply(0, 0)

    @classmethod
    def for_run(cls, plan, schedule, rates, echo=print) -> FitMonitor | None:
        """The monitor of a run whose project.json says epoch_count "fit"; None for a number."""
        return cls(plan, schedule, rates, echo) if plan.config.epoch_count == FIT else None

    def checkpoint_objects(self) -> dict:
        return {"planned_epochs": self.planned, "schedule_anchor": self.anchor}

    def apply(self, epochs: int, used_epoch: int) -> None:
        """Train `epochs` epochs (0: not planned yet)."""
        self.schedule.epoch_count = epochs or used_epoch + 1
        self.rates.epoch_count = epochs or math.inf

    def resume(self, counters, restore_seconds: float, worker_sums=None) -> None:
        """After the restore: train on the restored plan until this run has made its own."""
        self.resumed_plan = int(self.planned.numpy()) or self.numbered_count(counters)
        self.restore_seconds, self.worker_sums = restore_seconds, worker_sums
        where, reached = (float(value) for value in self.anchor.numpy())
        self.rates.anchor = (where, reached) if where >= 0 and self.planned.numpy() else None
        self.apply(self.resumed_plan, counters.used_epoch)
        self.clock.begin(counters.offset)

    def numbered_count(self, counters) -> int:
        """A checkpoint written while epoch_count was a number holds no plan: that number, from state.json, so
        the slice before this run plans goes on with the schedule it was on."""
        if not counters.used_minibatch:
            return 0
        count = (read_state_json(self.paths.checkpoints)[0] or {}).get("epoch_count")
        return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0

    def on_train_begin(self, run) -> None:
        if self.resumed_plan and self.schedule.trained_out(run.start.used_epoch, run.start.offset):
            self.echo(f"epoch_count fit: the {self.resumed_plan} planned epochs are trained; a run only plans "
                      f"again before its next slice, so set epoch_count to a number above {self.resumed_plan} "
                      "to train further")
        elif self.resumed_plan:
            self.echo(f"epoch_count fit: {self.resumed_plan} epochs, the resumed checkpoint's, until this run has "
                      "timed its first slice and planned again")
        else:
            self.echo(f"epoch_count fit: the first slice times the steps; the epochs that fit --time-limit "
                      f"{self.budget.text} are planned before its checkpoint")

    def on_step(self, progress, position: int) -> None:
        if self.plans_left:
            self.clock.step(position)

    # The second slice is timed from the end of what came before it: the checkpoint, the epoch end, an export.
    def on_slice_end(self, progress, checkpoint, logs: dict) -> None:
        self.clock.begin(progress.offset)

    def on_epoch_end(self, progress, logs: dict) -> None:
        self.clock.begin(0)

    def on_export(self, path, kind: str) -> None:
        self.clock.begin(0)

    def before_checkpoint(self, progress, logs: dict) -> None:
        if not self.plans_left:
            return
        self.plans_left -= 1
        second = not self.plans_left
        costs = self.costs(whole_slice=second)
        epoch_seconds = costs.epoch_seconds(self.schedule, self.validation_records)
        done = progress.used_epoch + progress.offset / progress.train_records
        epochs = self.agreed(plan_epochs(done, self.seconds_left(costs), epoch_seconds))
        self.planned.assign(epochs)
        # The rest of the decay, from where it stands, over the new plan: the rate never climbs back.
        self.rates.replan(epochs, progress.used_epoch, progress.used_minibatch)
        self.anchor.assign(self.rates.anchor if self.rates.anchor is not None else (-1.0, 0.0))
        self.apply(epochs, progress.used_epoch)
        self.echo(plan_line(epochs, done, costs, epoch_seconds, self.budget.text,
                            self.resumed_plan if not second else None, second))

    def costs(self, whole_slice: bool = False) -> EpochCosts:
        """What this run has measured (training/fit.py says what stands in for what it has not)."""
        budget = self.budget
        speed = self.clock.samples_per_second(whole_slice)
        if speed is None:
            raise ConfigError(file_field(self.config.config_path, "epoch_count",
                                         '"fit" could not time a step of the first slice'))
        checkpoint = budget.recent_checkpoint or self.restore_seconds
        validation = budget.recent_validation or self.validation_records / speed
        export = budget.recent_export
        if export is None:
            export = EXPORT_PER_CHECKPOINT * checkpoint + validation
        return EpochCosts(speed, checkpoint, validation, export)

    def seconds_left(self, costs: EpochCosts) -> float:
        """The limit's time left for epochs, after this slice's checkpoint, the final export and the margin."""
        budget = self.budget
        return (budget.seconds - budget.elapsed() - costs.checkpoint - costs.export - budget.final_extra()
                - budget.margin)

    def agreed(self, epochs: int) -> int:
        """In a cluster every worker must train the same schedule: the workers' plans, averaged, rounded down."""
        if self.worker_sums is None:
            return epochs
        total, workers = self.worker_sums([float(epochs), 1.0])
        return max(int(total / workers + 1e-9), 1)
