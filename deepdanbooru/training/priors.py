"""What the training records say about each tag before any step: counts, log-odds, loss weights.

Standard library only. Pure functions of the training records, so every
process (and every resume) of a run computes the same values.
"""

from __future__ import annotations

import math

# Counted in project.tags; imported here because the trainer reads every prior from this module.


def log_odds(counts, records: int) -> list[float]:
    """ln(p / (1 - p)) with p = (count + 0.5) / (records + 1): the bias at which a sigmoid outputs the
    tag's frequency; the half count keeps a tag seen never (or always) finite."""
    result = []
    for count in counts:
        p = (count + 0.5) / (records + 1)
        result.append(math.log(p / (1.0 - p)))
    return result


def log_frequency_weights(counts, records: int) -> list[float]:
    """1 + ln(records / count) per tag (a tag never seen counts as 1), scaled so the mean is 1: the loss
    keeps its scale, and a tag 100x rarer weighs about ln(100) = 4.6 more before scaling."""
    raw = [1.0 + math.log(max(records, 1) / max(count, 1)) for count in counts]
    mean = sum(raw) / len(raw)
    return [value / mean for value in raw]
