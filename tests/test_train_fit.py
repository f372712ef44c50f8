"""epoch_count "fit": planning the epochs from the measured speed, the stretched schedule, the plan on resume.

No test depends on how fast this machine is: the runs here replace the time left (or the plan itself) with
fixed values, and the limits they run under are far longer than they take.
"""

import json
import math
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from train_helpers import assert_same_weights, killed_copy, make_project, read_state

from deepdanbooru.cli import main
from deepdanbooru.project.config import load_config
from deepdanbooru.training.fit import EpochCosts, StepClock, plan_epochs, plan_line
from deepdanbooru.training.schedule import LearningRateSchedule, Schedule

# 24 records, batch 4, slices of 2 minibatches: 6 minibatches an epoch in 3 slices; the warmup is 3 of them.
FIT = dict(epoch_count="fit", lr_schedule="warmup_cosine", warmup_epochs=0.5, learning_rate=0.01,
           min_learning_rate=0.001)


def test_the_plan_is_the_epochs_done_plus_those_the_time_left_holds_rounded_down():
    assert plan_epochs(0.4, 100.0, 30.0) == 3  # 0.4 + 3.33
    assert plan_epochs(0.4, 78.0, 30.0) == 3 and plan_epochs(0.4, 77.0, 30.0) == 2
    assert plan_epochs(5.3, 0.0, 30.0) == 6  # no time left: the epoch in progress still ends the schedule
    assert plan_epochs(2.0, -50.0, 30.0) == 2  # at an epoch end with nothing left: no further epoch
    assert plan_epochs(0.1, 0.0, 30.0) == 1


def test_an_epoch_costs_its_steps_checkpoints_validations_and_exports():
    config = SimpleNamespace(checkpoint_frequency_mb=1, minibatch_size=3, epoch_count=2, seed=0,
                             validation_frequency_slices=2, export_model_per_epoch=2)
    schedule = Schedule.from_config(config, 10)  # 4 slices; validation after the 2nd and the last
    assert (schedule.slices_per_epoch, schedule.validations_per_epoch(), schedule.exports_per_epoch()) == (4, 2, 0.5)
    costs = EpochCosts(samples_per_second=5.0, checkpoint=1.0, validation=3.0, export=4.0)
    assert costs.epoch_seconds(schedule, validation_records=6) == 10 / 5 + 4 * 1 + 2 * 3 + 0.5 * 4
    assert costs.epoch_seconds(schedule, validation_records=0) == 10 / 5 + 4 * 1 + 0.5 * 4


def test_the_plan_costs_each_part_as_its_last_timing_not_its_first_compiling_one():
    from deepdanbooru.training.budget import TimeBudget
    from deepdanbooru.training.fit_monitor import FitMonitor

    budget = TimeBudget(360.0)
    monitor = SimpleNamespace(budget=budget, clock=SimpleNamespace(samples_per_second=lambda whole_slice: 400.0),
                              config=None, restore_seconds=0.5, validation_records=200)
    before = FitMonitor.costs(monitor)  # nothing timed: a validation as long as training on its records
    assert (before.checkpoint, before.validation, before.export) == (0.5, 0.5, 2 * 0.5 + 0.5)
    for seconds in (3.9, 1.1, 1.0):  # the first validation traces and compiles
        budget.validation_took(seconds)
    for seconds in (0.8, 0.3):
        budget.checkpoint_took(seconds)
    costs = FitMonitor.costs(monitor)
    assert (costs.samples_per_second, costs.checkpoint, costs.validation, costs.export) == (400.0, 0.3, 1.0, 1.6)
    budget.export_took(2.5)
    budget.export_took(0.9)
    assert FitMonitor.costs(monitor).export == 0.9
    # The limit itself still keeps room for the slowest of each.
    assert (budget.longest_validation, budget.longest_checkpoint, budget.export_estimate()) == (3.9, 0.8, 2.5)


def test_the_step_speed_leaves_out_the_first_step_unless_there_is_only_one():
    now = [0.0]
    clock = StepClock(lambda: now[0])
    clock.begin(8)  # resumed 8 records into the epoch
    assert clock.samples_per_second() is None
    now[0] = 30.0  # the first step carries tracing
    clock.step(12)
    assert clock.samples_per_second() == pytest.approx(4 / 30)
    now[0], position = 31.0, 16
    clock.step(position)
    now[0] = 32.5
    clock.step(20)
    assert clock.samples_per_second() == pytest.approx(8 / 2.5)
    assert clock.samples_per_second(whole_slice=True) == pytest.approx(12 / 32.5)  # from begin(): a later slice


def test_the_plan_line_says_epochs_limit_and_speed():
    costs = EpochCosts(48.0, 1.0, 2.0, 3.0)
    assert plan_line(12, 0.3, costs, 28.5, "6m", 0) == (
        "epoch_count fit: 12 epochs planned in 6m at 48 samples/s (an epoch about 28.5 s)")
    assert plan_line(20, 8.25, costs, 28.5, "6m", 12).endswith("(an epoch about 28.5 s; 8.25 done, 12 planned "
                                                               "when the run resumed)")


def write_fit_config(tmp_path, **values):
    (tmp_path / "project.json").write_text(json.dumps({**FIT, "minibatch_size": 4, **values}))
    return load_config(tmp_path)


def test_the_cosine_ends_at_the_planned_last_epoch(tmp_path):
    config = write_fit_config(tmp_path)
    for planned in (2, 5):
        rates = LearningRateSchedule(config, 24, epoch_count=planned)
        last = planned * 6 - 1  # the last minibatch of the planned last epoch
        assert rates.rate(planned - 1, last) == pytest.approx(0.001 + 0.009 * 0.5 * (1 + math.cos(
            math.pi * (last - 3) / (planned * 6 - 3))))
        assert rates.rate(planned, last + 1) == 0.001  # the end value, from the first step after the plan
        assert all(rates.rate(u // 6, u) > 0.001 for u in range(last + 1))
    # Before a fresh run has planned: the warmup, then the rate held where the cosine begins.
    unplanned = LearningRateSchedule(config, 24, epoch_count=math.inf)
    assert [unplanned.rate(0, u) for u in range(5)] == pytest.approx([0.01 / 3, 0.02 / 3, 0.01, 0.01, 0.01])


def test_train_project_without_a_time_limit_refuses_fit_in_one_line(tmp_path, sample_dataset):
    project = make_project(tmp_path / "p", *sample_dataset, **FIT)
    result = CliRunner().invoke(main, ["train-project", str(project)])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f'error: {project / "project.json"}: epoch_count: "fit" plans the epochs that fit train-project\'s '
        "--time-limit, and none was given; give --time-limit (e.g. --time-limit 6m) or set epoch_count to a "
        "number of epochs"]
    assert not (project / "checkpoints").exists()


def time_left_for(monkeypatch, epochs: float) -> None:
    """The time left, whenever a run plans, holds `epochs` epochs at the costs it measured."""
    from deepdanbooru.training.fit_monitor import FitMonitor

    monkeypatch.setattr(FitMonitor, "seconds_left",
                        lambda self, costs: epochs * costs.epoch_seconds(self.schedule, self.validation_records))


def train_rates(project):
    from deepdanbooru.training.history import read_history

    return {r["used_minibatch"]: r["learning_rate"] for r in read_history(project / "logs" / "history.jsonl")
            if r.get("kind") == "train"}


@pytest.mark.slow
def test_a_fit_run_plans_trains_the_planned_epochs_and_ends_the_cosine_there(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training.train import train_project

    time_left_for(monkeypatch, 2.0)
    project = make_project(tmp_path / "p", *sample_dataset, **FIT)
    lines = []
    counters = train_project(project, echo=lines.append, time_limit=3600.0)
    # Planned after the first slice (8 of 24 records): 1/3 + 2 epochs, rounded down; after the second, 2/3 + 2.
    plan = [line for line in lines if line.startswith("epoch_count fit: ")]
    assert plan[0].startswith("epoch_count fit: the first slice times the steps") and len(plan) == 3
    assert plan[1].startswith("epoch_count fit: 2 epochs planned in 3600s at ") and "second" not in plan[1]
    assert plan[2].startswith("epoch_count fit: 2 epochs planned in 3600s at ")
    assert plan[2].endswith("; planned again from the second slice, its input's start and a checkpoint timed)")
    assert (counters.used_epoch, counters.used_minibatch) == (2, 12)
    state = read_state(project)
    assert (state["epoch_count"], state["used_epoch"], state["complete"]) == (2, 2, True)
    # Every step's rate is the schedule's over the 2 planned epochs; the last is the cosine's last before its end.
    expected = LearningRateSchedule(load_config(project), 24, epoch_count=2)
    assert train_rates(project) == {u: pytest.approx(expected.rate((u - 1) // 6, u - 1)) for u in range(1, 13)}
    assert expected.rate(2, 12) == 0.001


@pytest.mark.slow
def test_a_resumed_fit_run_plans_again_from_its_time_left_and_keeps_the_epochs_done(
        tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, **FIT)
    time_left_for(monkeypatch, 3.0)
    first = []
    # A limit already passed: the first slice, its plan and checkpoint, then the stop.
    train_project(project, echo=first.append, time_limit=1e-3)
    assert any(line.startswith("epoch_count fit: 3 epochs planned in 0.001s") for line in first)
    assert first[-1].startswith("Stopped for the time limit") and "at epoch 1/3, record 8/24, step 2" in first[-1]
    assert (read_state(project)["epoch_count"], read_state(project)["offset"]) == (3, 8)

    time_left_for(monkeypatch, 4.0)  # a longer limit: after its first slice 2/3 of an epoch is done, 4 more fit
    second = []
    counters = train_project(project, echo=second.append, time_limit=3600.0)
    assert ("epoch_count fit: 3 epochs, the resumed checkpoint's, until this run has timed its first slice "
            "and planned again") in second
    planned = [line for line in second if " epochs planned in " in line]
    assert len(planned) == 2 and planned[0].startswith("epoch_count fit: 4 epochs planned in 3600s at ")
    assert planned[0].endswith("; 0.67 done, 3 planned when the run resumed)")
    assert planned[1].startswith("epoch_count fit: 5 epochs planned in 3600s at ")  # 1 epoch done, 4 more fit
    # The steps done before are kept: 5 epochs of 6 minibatches in all, the first 2 from the first run.
    assert (counters.used_epoch, counters.used_minibatch, counters.offset) == (5, 30, 0)
    state = read_state(project)
    assert (state["epoch_count"], state["used_epoch"], state["complete"]) == (5, 5, True)
    rates = train_rates(project)
    # Each slice trains on the plan of the checkpoint before it: the first run's 3 epochs, then each of this run's,
    # the rest of the cosine stretched over them from where it stood (step 4: 4 epochs; step 6: 5).
    expected = LearningRateSchedule(load_config(project), 24, epoch_count=3)
    assert [rates[u] for u in (3, 4)] == pytest.approx([expected.rate(0, 2), expected.rate(0, 3)])
    expected.replan(4, 0, 4)
    assert [rates[u] for u in (5, 6)] == pytest.approx([expected.rate(0, 4), expected.rate(0, 5)])
    expected.replan(5, 0, 6)
    assert [rates[u] for u in range(7, 31)] == pytest.approx([expected.rate((u - 1) // 6, u - 1)
                                                             for u in range(7, 31)])
    assert expected.rate(5, 30) == 0.001
    assert_only_decays_after_warmup(rates, warmup=3)

    # A complete plan stays complete: the next run plans nothing and only exports again.
    third = []
    assert train_project(project, echo=third.append, time_limit=3600.0).used_minibatch == 30
    assert ("epoch_count fit: the 5 planned epochs are trained; a run only plans again before its next slice, so set "
            "epoch_count to a number above 5 to train further") in third
    assert not any(" epochs planned in " in line for line in third)


@pytest.mark.slow
def test_a_killed_fit_run_resumes_bitwise_given_the_same_plan(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training import fit_monitor
    from deepdanbooru.training.train import train_project

    monkeypatch.setattr(fit_monitor, "plan_epochs", lambda done, seconds_left, epoch_seconds: 2)
    reference = make_project(tmp_path / "reference", *sample_dataset, **FIT, horizontal_flip=True)
    train_project(reference, echo=lambda *_: None, time_limit=3600.0)
    # Killed after the 5th checkpoint (epoch 2, record 16): its last slice, on the cosine, follows the plan.
    exports = ["model-resnet_small.e2.keras", "model-resnet_small.keras"]
    killed = killed_copy(reference, tmp_path / "killed", "ckpt-5", exports)
    lines = []
    train_project(killed, echo=lines.append, time_limit=3600.0)
    assert any(line.startswith(f"Resuming from {killed / 'checkpoints' / 'ckpt-5'}") for line in lines)
    assert "epoch_count fit: 2 epochs, the resumed checkpoint's, until this run has timed its first slice " \
           "and planned again" in lines
    for name in exports:
        assert_same_weights(reference / name, killed / name)
    assert train_rates(killed) == train_rates(reference)


@pytest.mark.slow
def test_a_run_switched_to_fit_goes_on_with_its_number_until_it_plans(tmp_path, sample_dataset, monkeypatch):
    from train_helpers import set_config

    from deepdanbooru.training.train import train_project

    # A warmup of 2 minibatches: the second slice is on the cosine.
    project = make_project(tmp_path / "p", *sample_dataset, **{**FIT, "epoch_count": 3, "warmup_epochs": 0.25})
    train_project(project, echo=lambda *_: None, time_limit=1e-3)  # one slice, then the stop
    set_config(project, epoch_count="fit")
    time_left_for(monkeypatch, 0.0)  # no time for more: the epoch in progress ends the plan
    lines = []
    counters = train_project(project, echo=lines.append, time_limit=3600.0)
    assert ("epoch_count fit: 3 epochs, the resumed checkpoint's, until this run has timed its first slice and "
            "planned again") in lines
    assert any(line.startswith("epoch_count fit: 1 epochs planned in 3600s") for line in lines)
    assert (counters.used_epoch, counters.used_minibatch) == (1, 6)
    rates = train_rates(project)
    expected = LearningRateSchedule(load_config(project), 24, epoch_count=3)
    # The slice before the plan keeps the 3-epoch cosine it was on, not the unplanned peak; the plan of 1 epoch
    # then ends the cosine at step 6 from where it stood.
    assert [rates[u] for u in (3, 4)] == pytest.approx([expected.rate(0, 2), expected.rate(0, 3)])
    assert expected.rate(0, 3) < 0.01
    expected.replan(1, 0, 4)
    assert [rates[u] for u in (5, 6)] == pytest.approx([expected.rate(0, 4), expected.rate(0, 5)])
    assert rates[4] > rates[5] > rates[6] > 0.001 and expected.rate(1, 6) == 0.001


# The steps schedule with drops at shares of the run: from epoch ceil(0.3 x N) and ceil(0.5 x N) of the plan N.
FIT_DROPS = dict(epoch_count="fit", learning_rate=0.01, learning_rates=[
    {"used_fraction": 0.3, "learning_rate": 0.005}, {"used_fraction": 0.5, "learning_rate": 0.001}])


def record_optimizer_rates(monkeypatch) -> dict:
    """The rate the optimizer holds after each slice, by used_minibatch: what the slice's steps trained with."""
    import numpy as np

    from deepdanbooru.training.slices import SliceRunner

    seen, train = {}, SliceRunner.train

    def recording(self, order, start, stop):
        train(self, order, start, stop)
        seen[int(self.counters.used_minibatch)] = float(np.asarray(self.optimizer.learning_rate))

    monkeypatch.setattr(SliceRunner, "train", recording)
    return seen


@pytest.mark.slow
def test_a_fit_run_places_its_used_fraction_drops_over_the_planned_epochs(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training.train import train_project

    time_left_for(monkeypatch, 2.5)  # planned 2 after the first slice (1/3 + 2.5), 3 after the second (2/3 + 2.5)
    optimizer_rates = record_optimizer_rates(monkeypatch)
    project = make_project(tmp_path / "p", *sample_dataset, **FIT_DROPS)
    lines = []
    counters = train_project(project, echo=lines.append, time_limit=3600.0)
    planned = [line for line in lines if " epochs planned in " in line]
    assert [line.split(" epochs")[0] for line in planned] == ["epoch_count fit: 2", "epoch_count fit: 3"]
    assert (counters.used_epoch, counters.used_minibatch) == (3, 18)
    # Over the 3 planned epochs the drops fall at epochs 1 (0.9 -> 1) and 2 (1.5 -> 2); over the first plan's
    # 2 both would have fallen at epoch 1.
    expected = LearningRateSchedule(load_config(project), 24, epoch_count=3)
    assert [expected.rate(epoch, 0) for epoch in range(3)] == [0.01, 0.005, 0.001]
    assert train_rates(project) == {u: pytest.approx(expected.rate((u - 1) // 6, u - 1)) for u in range(1, 19)}
    assert optimizer_rates == {u: pytest.approx(expected.rate((u - 1) // 6, u - 1)) for u in range(2, 19, 2)}


@pytest.mark.slow
def test_a_longer_plan_does_not_lift_a_drop_that_has_fallen(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.training import fit_monitor
    from deepdanbooru.training.train import train_project

    monkeypatch.setattr(fit_monitor, "plan_epochs", lambda done, seconds_left, epoch_seconds: 2)
    drops = dict(FIT_DROPS, learning_rates=[{"used_fraction": 0.5, "learning_rate": 0.001}])
    reference = make_project(tmp_path / "reference", *sample_dataset, **drops)
    train_project(reference, echo=lambda *_: None, time_limit=3600.0)
    # Killed after the 4th checkpoint (epoch 1, record 8) of a 2-epoch plan, whose drop fell at epoch 1; the
    # resumed run plans 3 before its first checkpoint. Over 3 epochs from the start the drop would be at epoch 2
    # (the rate back at 0.01 for the rest of epoch 1); the run goes on from half its schedule done instead.
    killed = killed_copy(reference, tmp_path / "killed", "ckpt-4", ["model-resnet_small.keras"])
    monkeypatch.setattr(fit_monitor, "plan_epochs", lambda done, seconds_left, epoch_seconds: 3)
    optimizer_rates = record_optimizer_rates(monkeypatch)
    counters = train_project(killed, echo=lambda *_: None, time_limit=3600.0)
    assert (counters.used_epoch, counters.used_minibatch) == (3, 18)
    assert optimizer_rates == pytest.approx({10: 0.001, 12: 0.001, 14: 0.001, 16: 0.001, 18: 0.001})
    rates = train_rates(killed)
    assert [rates[u] for u in range(1, 19)] == pytest.approx([0.01] * 6 + [0.001] * 12)
    # A plan placing a drop that has not fallen yet still places it over the new count.
    config = load_config(killed)
    schedule = LearningRateSchedule(config, 24, epoch_count=4)
    schedule.replan(6, 1, 6)  # progress 1/4 at epoch 1, then 1/4 + 3/4 (e - 1) / 5: 0.5 at epoch 2.67
    assert [schedule.rate(e, 6 * e) for e in range(6)] == [0.01, 0.01, 0.01, 0.001, 0.001, 0.001]

def assert_only_decays_after_warmup(rates: dict, warmup: int) -> None:
    after = [rates[u] for u in sorted(rates) if u > warmup]
    rises = [(u, rates[u - 1], rates[u]) for u in sorted(rates) if u > warmup + 1 and rates[u] > rates[u - 1] + 1e-12]
    assert after and not rises, f"the rate rose after the warmup at (step, before, after): {rises}"


@pytest.mark.slow
def test_a_fit_run_stopped_and_resumed_twice_only_decays_after_its_warmup(tmp_path, sample_dataset, monkeypatch):
    """Each resumed run plans more epochs than the one before (a longer limit): the rest of the cosine is
    stretched over them from where the rate stands; it never climbs back."""
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, **FIT)
    time_left_for(monkeypatch, 1.0)
    train_project(project, echo=lambda *_: None, time_limit=1e-3)  # one slice on a plan of 1 epoch, then the stop
    assert read_state(project)["epoch_count"] == 1
    # 2 epochs planned after this run's first slice (2/3 done + 2 fit), 3 after its second; stopped at step 10.
    time_left_for(monkeypatch, 2.0)
    monkeypatch.setattr("deepdanbooru.training.loop.SliceTrainer._another_slice_fits",
                        lambda self: self.counters.used_minibatch < 10, raising=False)
    train_project(project, echo=lambda *_: None, time_limit=3600.0)
    monkeypatch.undo()
    time_left_for(monkeypatch, 3.0)
    counters = train_project(project, echo=lambda *_: None, time_limit=3600.0)
    state = read_state(project)
    assert state["complete"] and state["epoch_count"] >= 4 and counters.used_minibatch == 6 * state["epoch_count"]
    rates = train_rates(project)
    assert sorted(rates) == list(range(1, counters.used_minibatch + 1))
    assert_only_decays_after_warmup(rates, warmup=3)
    assert rates[counters.used_minibatch] < 0.01 and rates[counters.used_minibatch] >= 0.001
