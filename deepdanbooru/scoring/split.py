"""Training / validation split decided by each post id alone.

A record's side depends only on (seed, post id), never on its index or on
how many rows the database has (a database built with --group-duplicates
gives copies of one picture a shared `split_id`, hashed instead of the id), so adding posts later does not move any
existing post across the split, and training never sees a validation post.
"""

from __future__ import annotations

import hashlib

import numpy as np

from deepdanbooru.dataset.records import Records

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a fixed, well-mixing 64-bit hash (uint64 arithmetic wraps)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def validation_mask(ids, validation_fraction: float, seed: int) -> np.ndarray:
    """Boolean array: True where the post id belongs to validation."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if validation_fraction <= 0 or ids.size == 0:
        return np.zeros(ids.shape, dtype=bool)
    with np.errstate(over="ignore"):
        keyed = _splitmix64(np.full(ids.shape, seed, dtype=np.uint64)) ^ ids
        hashed = _splitmix64(keyed) & _MASK
    # The top 53 bits as a float in [0, 1): exact, so the cut is the same everywhere.
    uniform = (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return uniform < validation_fraction


def split_records(records: Records, validation_fraction: float, seed: int) -> tuple[Records, Records]:
    """(training, validation) subsets of `records`, each still in id order."""
    mask = validation_mask(records.split_keys, validation_fraction, seed)
    indices = np.arange(len(records))
    return records.subset(indices[~mask].tolist()), records.subset(indices[mask].tolist())


def records_hash(records: Records) -> str:
    """A short hash of the training ids: checkpoints and state.json record it to notice a changed database."""
    return hashlib.sha256(np.asarray(records.ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def split_for_run(records: Records, validation_fraction: float, seed: int, saved_state: dict | None):
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
    by_id = Records(records.database_path, records.ids, records.md5s, records.file_exts, records.tag_strings)
    id_train, id_validation = split_records(by_id, validation_fraction, seed)
    if saved is not None and saved != records_hash(id_train):
        return train, validation, None  # the database changed in other ways too; the resume notice covers it
    return id_train, id_validation, (
        f"notice: {records.database_path}: posts.split_id is ignored for this run, which started before it "
        "was set; delete the checkpoints to train on the grouped split")
