"""Training / validation split decided by each post id alone.

A record's side depends only on (seed, post id), never on its index or on
how many rows the database has, so adding posts later does not move any
existing post across the split, and training never sees a validation post.
"""

from __future__ import annotations

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
    mask = validation_mask(records.ids, validation_fraction, seed)
    indices = np.arange(len(records))
    return records.subset(indices[~mask].tolist()), records.subset(indices[mask].tolist())
