"""Which records a dataset dropped: the positions it was given minus the positions that came out.

Every element of our datasets carries its position and failing records are
removed before batching, so the gaps are exactly the dropped records. This is
the one place that computes them, for training slices (whole or one worker's
shard), validation, evaluate and evaluate-project.
"""

from __future__ import annotations

import numpy as np


class PositionGaps:
    """Collect the positions that came out, then ask which of the expected ones are missing."""

    def __init__(self):
        self._observed: list[np.ndarray] = []

    def observe(self, positions) -> None:
        """The positions (int64) of one batch; replicas' parts may come in any order."""
        self._observed.append(np.asarray(positions, dtype=np.int64).reshape(-1))

    def missing(self, expected) -> np.ndarray:
        """The positions of `expected` (ascending) not observed, in order.

        Observations past the last expected position are kept for the next
        call, so a stream read in order can be asked about each stretch as soon
        as a later position has arrived, in time proportional to the stretch.
        """
        expected = np.asarray(expected, dtype=np.int64)
        observed = np.concatenate(self._observed) if self._observed else np.zeros(0, np.int64)
        self._observed = [observed[observed > expected[-1]]] if len(expected) else [observed]
        return np.setdiff1d(expected, observed)
