"""The run's schedule: slice bounds, when validation and exports fall, when a run is trained out."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from deepdanbooru.project.config import load_config
from deepdanbooru.training.schedule import LearningRateSchedule, Schedule, epoch_order


def schedule(records=10, every=2, export_every=1, epochs=2) -> Schedule:
    config = SimpleNamespace(checkpoint_frequency_mb=1, minibatch_size=3, epoch_count=epochs, seed=7,
                             validation_frequency_slices=every, export_model_per_epoch=export_every)
    return Schedule.from_config(config, records)


def test_slices_cover_the_epoch_and_validation_falls_every_nth_and_at_the_end():
    s = schedule()
    stops, offset = [], 0
    while offset < s.train_records:
        offset = s.slice_stop(offset)
        stops.append(offset)
    assert stops == [3, 6, 9, 10] and s.slices_per_epoch == 4
    assert [s.validation_after(stop) for stop in stops] == [None, "slice", None, "epoch"]
    assert [schedule(every=0).validation_after(stop) for stop in stops] == [None, None, None, "epoch"]


def test_exports_and_the_end_of_training():
    assert [schedule(export_every=2).export_due(epoch) for epoch in (1, 2, 3, 4)] == [False, True, False, True]
    assert schedule(export_every=0).export_due(3)
    s = schedule(epochs=2)
    assert not s.trained_out(1, 9) and s.trained_out(1, 10) and s.trained_out(2, 0)
    assert s.done_records(1, 4) == 14


def test_a_time_limit_reserves_the_epoch_export_only_for_the_slice_that_ends_an_exporting_epoch():
    s = schedule(export_every=2)  # slices start at 0, 3, 6, 9; epoch 2 exports, epoch 1 does not
    assert [s.exports_after_slice(0, offset) for offset in (0, 3, 6, 9)] == [1, 1, 1, 1]
    assert [s.exports_after_slice(1, offset) for offset in (0, 3, 6, 9)] == [1, 1, 1, 2]


def test_epoch_order_is_a_seeded_permutation():
    order = schedule().order(3)
    assert sorted(order.tolist()) == list(range(10))
    np.testing.assert_array_equal(order, epoch_order(10, 7, 3))
    assert not np.array_equal(order, epoch_order(10, 7, 4))


def test_the_step_drops_given_as_shares_are_placed_over_the_schedule_s_epoch_count(tmp_path):
    drops = [{"used_epoch": 0, "learning_rate": 0.5}, {"used_fraction": 0.5, "learning_rate": 0.1},
             {"used_fraction": 0.8, "learning_rate": 0.01}]
    (tmp_path / "project.json").write_text(json.dumps({"epoch_count": "fit", "learning_rates": drops}))
    config = load_config(tmp_path)

    def rates(epoch_count, epochs):
        schedule = LearningRateSchedule(config, 24, epoch_count=epoch_count)
        return [schedule.rate(epoch, 6 * epoch) for epoch in range(epochs)]

    # Planned 10: from epoch 5 and 8; planned 3: from ceil(1.5) = 2 and ceil(2.4) = 3 (past the last epoch).
    assert rates(10, 10) == [0.5] * 5 + [0.1] * 3 + [0.01] * 2
    assert rates(3, 3) == [0.5, 0.5, 0.1]
    assert rates(math.inf, 4) == [0.5] * 4  # before a fresh run has planned: only the fixed entry
    (tmp_path / "project.json").write_text(json.dumps({"epoch_count": 10, "learning_rates": drops}))
    assert LearningRateSchedule(load_config(tmp_path), 24).rate(8, 0) == 0.01  # a number: project.json's


def cosine_config(tmp_path, **values):
    (tmp_path / "project.json").write_text(json.dumps({
        "epoch_count": "fit", "lr_schedule": "warmup_cosine", "warmup_epochs": 0.5, "learning_rate": 0.01,
        "min_learning_rate": 0.001, "minibatch_size": 4, **values}))
    return load_config(tmp_path)


def test_a_longer_plan_stretches_the_rest_of_the_cosine_from_where_it_stands(tmp_path):
    # 6 minibatches an epoch, warmup 3. A plan of 14 epochs, then 19 from step 40 on (a resumed run's own plan).
    schedule = LearningRateSchedule(cosine_config(tmp_path), 24, epoch_count=14)
    before = [schedule.rate(u // 6, u) for u in range(41)]
    schedule.replan(19, 40 // 6, 40)
    after = [schedule.rate(u // 6, u) for u in range(40, 19 * 6 + 1)]
    assert after[0] == pytest.approx(before[40])  # no jump where the new plan takes over
    rates = before[:40] + after
    assert all(b <= a + 1e-15 for a, b in zip(rates[3:], rates[4:]))  # after the warmup it only decays
    assert rates[19 * 6] == 0.001 and rates[19 * 6 - 1] > 0.001  # and ends where the new plan ends
    # The plain 19-epoch cosine would have been higher at step 40: the rate would have climbed back.
    assert LearningRateSchedule(cosine_config(tmp_path), 24, epoch_count=19).rate(6, 40) > before[39]
    # Earlier steps still read as they trained; a shorter plan ends the decay sooner, again from where it is.
    assert [schedule.rate(u // 6, u) for u in range(40)] == before[:40]
    schedule.replan(12, 60 // 6, 60)
    assert schedule.rate(10, 60) == pytest.approx(after[20]) and schedule.rate(9, 59) == pytest.approx(after[19])
    shorter = [schedule.rate(u // 6, u) for u in range(60, 73)]
    assert all(b < a for a, b in zip(shorter, shorter[1:])) and shorter[-1] == 0.001 and shorter[-2] > 0.001
    schedule.replan(10, 66 // 6, 66)  # a plan the run has already reached: the rest is the end value
    assert schedule.rate(11, 66) == 0.001


def test_a_plan_made_before_any_other_is_the_plain_schedule(tmp_path):
    config = cosine_config(tmp_path)
    planned = LearningRateSchedule(config, 24, epoch_count=math.inf)
    planned.replan(5, 0, 2)
    plain = LearningRateSchedule(config, 24, epoch_count=5)
    assert planned.anchor is None
    assert [planned.rate(u // 6, u) for u in range(31)] == [plain.rate(u // 6, u) for u in range(31)]
    # The same count again changes nothing either.
    planned.replan(5, 0, 4)
    assert [planned.rate(u // 6, u) for u in range(4, 31)] == pytest.approx([plain.rate(u // 6, u)
                                                                          for u in range(4, 31)])


def test_a_fallen_step_drop_stays_fallen_after_a_longer_plan(tmp_path):
    drops = [{"used_fraction": 0.3, "learning_rate": 0.005}, {"used_fraction": 0.5, "learning_rate": 0.001}]
    (tmp_path / "project.json").write_text(json.dumps({"epoch_count": "fit", "learning_rate": 0.01,
                                                      "learning_rates": drops}))
    schedule = LearningRateSchedule(load_config(tmp_path), 24, epoch_count=4)
    assert [schedule.rate(e, 0) for e in range(4)] == [0.01, 0.01, 0.001, 0.001]  # 0.3 x 4 -> 2, 0.5 x 4 -> 2
    schedule.replan(10, 2, 12)  # at epoch 2 both had fallen (2/4 = 0.5); over 10 from the start neither would
    assert [schedule.rate(e, 0) for e in range(10)] == [0.01, 0.01] + [0.001] * 8
    schedule = LearningRateSchedule(load_config(tmp_path), 24, epoch_count=4)
    schedule.replan(10, 1, 6)  # at epoch 1 (1/4) none had: 0.3 from epoch 1.6 on (so 2), 0.5 from 4
    assert [schedule.rate(e, 0) for e in range(10)] == [0.01, 0.01, 0.005, 0.005, 0.001] + [0.001] * 5
