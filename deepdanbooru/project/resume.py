"""Where a run resumes, from the counters a checkpoint holds. Standard library only.

A run's last checkpoint is written after the last slice of an epoch, before the
epoch end moves used_epoch on (as DeepDanbooru's counters do), so the same point can be read as
(used_epoch e, offset = train records) from a checkpoint or as (e + 1, 0) from
the final state.json (runstate.state reads and writes it). This module is the one reading of both that
train-project, preflight, the interrupt message and best.json print. It also keeps checkpoints/start.json, the
record of the --source-model a run started from, which train-project writes and preflight reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.runstate.state import SCHEDULE_COUNTERS, read_state_json


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


def has_checkpoint(checkpoints) -> bool:
    """Whether `checkpoints` holds a checkpoint to resume: TensorFlow's index file naming the latest is there."""
    return (Path(checkpoints) / "checkpoint").is_file()


def fine_tuned_network(checkpoints) -> dict | None:
    """state.json's record of the network a --source-model run trains ({"network", "source", "parameters"}),
    while checkpoints/ holds a checkpoint to resume; None otherwise. A resumed run rebuilds that network
    from the checkpoint, whatever project.json's model says (training.network)."""
    state, _ = read_state_json(checkpoints)
    if state is None or not has_checkpoint(checkpoints):
        return None
    counts = state.get("parameters")
    if not (isinstance(state.get("source"), str) and isinstance(state.get("network"), str)
            and isinstance(counts, dict) and all(isinstance(counts.get(key), int)
                                                  for key in ("trainable", "non_trainable"))):
        return None
    return {key: state[key] for key in ("network", "source", "parameters")}


def source_path(source) -> Path:
    """A --source-model as a checkpoint records and compares it: absolute, links resolved."""
    return Path(source).expanduser().resolve()


# checkpoints/start.json: the --source-model (and --source-tags) a run started from, written before its first
# step. A run stopped before its first checkpoint leaves no other record of it, and one started again without
# the options would otherwise train from scratch, its frozen blocks random.
START_FILE = "start.json"


def record_start(checkpoints, source_model, source_tags) -> None:
    payload = {"source_model": str(source_path(source_model)),
               "source_tags": str(source_path(source_tags)) if source_tags is not None else None}
    Path(checkpoints).mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(checkpoints) / START_FILE, json.dumps(payload, indent=2) + "\n")


def recorded_start(checkpoints) -> tuple[str, str | None] | None:
    """(source model, source tags or None) of a run from --source-model that stopped before its first checkpoint;
    None when the project has a checkpoint, or its run did not start from a source."""
    checkpoints = Path(checkpoints)
    record = checkpoints / START_FILE
    if has_checkpoint(checkpoints) or not record.is_file():
        return None
    try:
        payload = json.loads(record.read_text(encoding="utf-8"))
        source, tags = payload["source_model"], payload["source_tags"]
        if not isinstance(source, str) or not (tags is None or isinstance(tags, str)):
            raise TypeError
    except (OSError, ValueError, TypeError, KeyError):
        raise TrainingError(file_field(record, None, (
            "cannot be read (it names the --source-model the stopped run started from); give --source-model "
            "again, or delete it to train from scratch"))) from None
    return source, tags
