"""The run's schedule: slice bounds, when validation and exports fall, when a run is trained out."""

from types import SimpleNamespace

import numpy as np

from deepdanbooru.training.schedule import Schedule, epoch_order


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


def test_epoch_order_is_a_seeded_permutation():
    order = schedule().order(3)
    assert sorted(order.tolist()) == list(range(10))
    np.testing.assert_array_equal(order, epoch_order(10, 7, 3))
    assert not np.array_equal(order, epoch_order(10, 7, 4))
