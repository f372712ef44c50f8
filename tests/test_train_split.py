"""The validation split follows the post id, not the row count."""

from array import array
from pathlib import Path

import numpy as np

from deepdanbooru.dataset.records import Records
from deepdanbooru.scoring.split import split_records, validation_mask


def _records(ids):
    return Records(Path("db.sqlite"), array("q", ids), [f"{i:032x}" for i in ids], ["jpg"] * len(ids),
                   [f"tag{i % 7}" for i in ids])


def test_fraction_and_determinism():
    ids = np.arange(1, 20001)
    mask = validation_mask(ids, 0.1, seed=0)
    assert 0.09 < mask.mean() < 0.11
    assert (validation_mask(ids, 0.1, seed=0) == mask).all()
    assert (validation_mask(ids, 0.1, seed=1) != mask).any()
    assert not validation_mask(ids, 0.0, seed=0).any()


def test_split_does_not_move_when_the_database_grows():
    small = _records(list(range(1, 1001)))
    grown = _records(list(range(1, 3001)))
    train_small, validation_small = split_records(small, 0.2, seed=3)
    train_grown, validation_grown = split_records(grown, 0.2, seed=3)
    assert set(validation_small.ids) == {i for i in validation_grown.ids if i <= 1000}
    assert set(train_small.ids) == {i for i in train_grown.ids if i <= 1000}


def test_split_is_a_partition_in_id_order():
    records = _records([5, 9, 11, 200, 3000, 40000, 500000, 2**40])
    train, validation = split_records(records, 0.5, seed=0)
    assert sorted(list(train.ids) + list(validation.ids)) == list(records.ids)
    assert list(train.ids) == sorted(train.ids) and list(validation.ids) == sorted(validation.ids)
    for part in (train, validation):
        for i, post_id in enumerate(part.ids):
            assert part.md5s[i] == f"{post_id:032x}"
            assert part.tag_strings[i] == f"tag{post_id % 7}"


def test_known_values_are_stable():
    # Pinned: changing the hash would silently move posts between train and validation on upgrade.
    assert validation_mask(np.arange(1, 21), 0.25, seed=0).nonzero()[0].tolist() == [0, 3, 4, 17]
    assert validation_mask(np.arange(1, 21), 0.25, seed=7).nonzero()[0].tolist() == [0, 6, 7, 11, 14, 15, 17, 18]


def test_a_changed_split_counts_the_validation_posts_trained_on_before():
    from deepdanbooru.scoring.split import split_change

    records = _records(range(1, 201))
    before = {"validation_fraction": 0.1, "seed": 0}
    train, validation = split_records(records, 0.3, 0)
    old_train, old_validation = split_records(records, 0.1, 0)
    seen = len(set(validation.ids) - set(old_validation.ids))
    assert seen > 0 and set(old_validation.ids) <= set(validation.ids)  # the split only grows with the fraction
    assert split_change(records, validation, 0.3, 0, before, "p/project.json") == (
        f"warning: p/project.json: the validation split changed (validation_fraction 0.1 -> 0.3): {seen} of its "
        f"{len(validation)} posts were trained on before, so validation will overstate the model; the best model is "
        "chosen afresh (put the old values back to keep the split the run started with)")
    # Shrunk: every post still held out was held out before.
    assert split_change(records, old_validation, 0.1, 0, {"validation_fraction": 0.3, "seed": 0}, "p") == (
        f"notice: p: the validation split changed (validation_fraction 0.3 -> 0.1); none of its "
        f"{len(old_validation)} posts was trained on, and the best model is chosen afresh")
    assert split_change(records, validation, 0.3, 0, {"validation_fraction": 0.3, "seed": 0}, "p") is None
    assert split_change(records, validation, 0.3, 0, {"records_hash": "x"}, "p") is None  # written before the record
    empty = split_records(records, 0.0, 0)[1]  # validation switched off: nothing to choose a best model on
    assert split_change(records, empty, 0.0, 0, {"validation_fraction": 0.3, "seed": 0}, "p") is None
    assert "seed 0 -> 5" in split_change(records, split_records(records, 0.3, 5)[1], 0.3, 5,
                                         {"validation_fraction": 0.3, "seed": 0}, "p")
