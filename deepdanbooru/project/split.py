"""Which side of the validation split a post falls on: a function of (seed, its split key) alone.

STANDARD LIBRARY ONLY, and written once for every caller: the same expression
runs on one Python int (preflight, find-duplicates; no numpy needed) and on a
numpy uint64 array (scoring.split, vectorised over a million posts). Python
ints are masked to 64 bits where numpy's uint64 wraps, so both give the same bits.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


def splitmix64(value):
    """The splitmix64 finaliser: a fixed, well-mixing 64-bit hash of an int or a uint64 array."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def in_validation(keys, validation_fraction: float, seed: int):
    """True where the key (the post id, or its split id) belongs to validation.

    keys: one int, or a numpy uint64 array (signed ids viewed as uint64). The top 53 bits of the hash,
    as a float in [0, 1), are compared with the fraction: exact, so the cut is the same everywhere.
    """
    hashed = splitmix64(splitmix64(seed & _MASK) ^ (keys & _MASK))
    return (hashed >> 11) / float(1 << 53) < validation_fraction
