"""Training / validation split decided by each post id alone.

A record's side depends only on (seed, post id), never on its index or on
how many rows the database has (a database built with --group-duplicates
gives copies of one picture a shared `split_id`, hashed instead of the id), so adding posts later does not move any
existing post across the split, and training never sees a validation post.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np

from deepdanbooru.project.split import in_validation


def validation_mask(ids, validation_fraction: float, seed: int) -> np.ndarray:
    """Boolean array: True where the post id (or split id) belongs to validation (project.split's rule)."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if validation_fraction <= 0 or ids.size == 0:
        return np.zeros(ids.shape, dtype=bool)
    return np.asarray(in_validation(ids, validation_fraction, seed), dtype=bool)


def split_records(records, validation_fraction: float, seed: int) -> tuple:
    """(training, validation) subsets of `records` (dataset.records.Records), each still in id order."""
    mask = validation_mask(records.split_keys, validation_fraction, seed)
    indices = np.arange(len(records))
    return records.subset(indices[~mask].tolist()), records.subset(indices[mask].tolist())


def records_hash(records) -> str:
    """A short hash of the training ids: checkpoints and state.json record it to notice a changed database."""
    return hashlib.sha256(np.asarray(records.ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def split_for_run(records, validation_fraction: float, seed: int, saved_state: dict | None):
    """(training, validation, note): the split of split_records, except for a run already started.

    A database given `split_id`s (--group-duplicates) after a run started
    would move grouped posts across the split under it. When the saved state
    (checkpoints/state.json) shows the run was trained on the split by post
    id (its records hash matches, or it predates the hash), that split is
    kept and `note` says so; otherwise note is None.
    """
    train, validation = split_records(records, validation_fraction, seed)
    if records.split_ids is None or saved_state is None:
        return train, validation, None
    saved = saved_state.get("records_hash")
    if saved == records_hash(train):
        return train, validation, None
    by_id = replace(records, split_ids=None)
    id_train, id_validation = split_records(by_id, validation_fraction, seed)
    if saved is not None and saved != records_hash(id_train):
        return train, validation, None  # the database changed in other ways too; the resume notice covers it
    return id_train, id_validation, (
        f"notice: {records.database_path}: posts.split_id is ignored for this run, which started before it "
        "was set; delete the checkpoints to train on the grouped split")


def split_change(records, validation, validation_fraction: float, seed: int, saved_state: dict | None,
                 config_path) -> str | None:
    """A line when the split settings changed since the saved state (checkpoints/state.json) was written: the
    validation posts the run trained on before, which validation then counts in the model's favour. None when
    they did not change, or the state predates their record."""
    if saved_state is None or "validation_fraction" not in saved_state or "seed" not in saved_state or \
            not len(validation):  # validation off now: the run says so, and chooses no best model
        return None
    before = (saved_state["validation_fraction"], saved_state["seed"])
    if before == (validation_fraction, seed):
        return None
    changed = ", ".join(f"{name} {old} -> {new}" for name, old, new in
                        (("validation_fraction", before[0], validation_fraction), ("seed", before[1], seed))
                        if old != new)
    try:
        trained, _ = split_records(records, float(before[0]), int(before[1]))
    except (TypeError, ValueError):
        return None
    seen = len(set(validation.ids) & set(trained.ids))
    if not seen:
        return (f"notice: {config_path}: the validation split changed ({changed}); none of its "
                f"{len(validation)} posts was trained on, and the best model is chosen afresh")
    return (f"warning: {config_path}: the validation split changed ({changed}): {seen} of its {len(validation)} "
            "posts were trained on before, so validation will overstate the model; the best model is chosen afresh "
            "(put the old values back to keep the split the run started with)")
