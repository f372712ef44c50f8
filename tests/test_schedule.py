"""The run's schedule: slice bounds, when validation and exports fall, when a run is trained out."""

import json
import math
from types import SimpleNamespace

import numpy as np

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
