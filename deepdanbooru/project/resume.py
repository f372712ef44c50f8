"""Where a run resumes, from the counters a checkpoint holds. Standard library only.

A run's last checkpoint is written after the last slice of an epoch, before the
epoch end moves used_epoch on (as DeepDanbooru's counters do), so the same point can be read as
(used_epoch e, offset = train records) from a checkpoint or as (e + 1, 0) from
the final state.json (runstate.state reads and writes it). This module is the one reading of both that
train-project, preflight, the interrupt message and best.json print.
"""

from __future__ import annotations

from typing import Mapping

from deepdanbooru.runstate.state import SCHEDULE_COUNTERS


def resume_point(counters: Mapping, train_records: int | None) -> dict[str, int]:
    """The schedule counters (runstate.state.SCHEDULE_COUNTERS) with a fully trained epoch counted as done
    (offset 0 of the next epoch)."""
    point = {name: counters[name] for name in SCHEDULE_COUNTERS if isinstance(counters.get(name), int)}
    if (train_records and point.get("offset", 0) >= train_records
            and "used_epoch" in point and "random_seed" in point):
        point["used_epoch"] += 1
        point["random_seed"] += 1  # what the epoch end does next
        point["offset"] = 0
    return point


def describe_resume_point(counters: Mapping, train_records: int | None, epoch_count: int | None = None) -> str:
    """One line: `used_epoch=3 used_minibatch=21 ... (3 of 3 epochs done)`, the same from every command."""
    point = resume_point(counters, train_records)
    text = " ".join(f"{name}={value}" for name, value in point.items())
    epoch, offset = point.get("used_epoch"), point.get("offset")
    if epoch is None:
        return text
    of = f" of {epoch_count}" if epoch_count else ""
    where = f"{epoch}{of} epoch(s) done"
    if offset and train_records:
        where += f", {offset} of {train_records} records into epoch {epoch + 1}"
    return f"{text} ({where})"
