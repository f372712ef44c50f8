"""checkpoints/state.json: the resume counters and what a checkpoint was trained for (standard library only).

The trainer keeps these values as tf.Variables inside every checkpoint
(training/state.py), so they can never disagree with the weights saved beside
them, and mirrors them here after each checkpoint is complete, for tools that
must not import TensorFlow (preflight). state.json is informational: if a run
dies between the checkpoint and the mirror, the checkpoint is still the truth.

state.json format (version 1), all keys always present:
    {"version": 1, "checkpoint": "<prefix file name in checkpoints/>",
     "used_epoch": int, "used_minibatch": int, "used_sample": int, "offset": int,
     "random_seed": int, "epoch_bad_images": int, "complete": bool,
     "model": str, "image_height": int, "image_width": int,
     "tags_hash": str, "tag_count": int, "trainable_blocks": int or null (absent in files written before it
     existed: null), "epoch_count": int (epoch_count "fit": the plan in force),
     "train_records": int,
     "records_hash": str (scoring.split.records_hash; absent in files written before it existed),
     "network": str (the Keras name of the network that trains), "source": str or null (its --source-model,
     absolute), "parameters": {"trainable": int, "non_trainable": int} (these three absent in older files)}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from deepdanbooru.errors import TrainingError
from deepdanbooru.fileio import write_text_atomic

STATE_FILE = "state.json"
STATE_VERSION = 1
# The counters that place a run in its schedule (docs/training.md): what logs and reports show.
SCHEDULE_COUNTERS = ("used_epoch", "used_minibatch", "used_sample", "offset", "random_seed")


@dataclass
class Counters:
    """Where training stands: epochs and steps done, records trained on, the offset into the current
    epoch's order, the epoch's shuffle seed, and the bad images met so far in this epoch."""

    used_epoch: int = 0
    used_minibatch: int = 0
    used_sample: int = 0
    offset: int = 0
    random_seed: int = 0
    epoch_bad_images: int = 0

    def next_epoch(self) -> None:
        """Move to the start of the next epoch: its shuffle seed is the next one, nothing of it trained yet."""
        self.used_epoch += 1
        self.random_seed += 1
        self.offset = 0
        self.epoch_bad_images = 0


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint's weights mean; resuming with any of these changed is refused."""

    model: str
    image_height: int
    image_width: int
    tags_hash: str
    tag_count: int
    # The frozen part differs, and with it the optimizer state and the weight average the checkpoint holds.
    trainable_blocks: int | None = None


def check_identity(saved: RunIdentity, current: RunIdentity, checkpoint_dir, tags_path, config_path) -> None:
    """Refuse to resume a checkpoint trained for something else, saying what changed."""
    changes = []
    if saved.model != current.model:
        changes.append(f"{config_path}: model was {saved.model!r}, now {current.model!r}")
    if (saved.image_height, saved.image_width) != (current.image_height, current.image_width):
        changes.append(f"{config_path}: input size (image_height x image_width) was "
                       f"{saved.image_height}x{saved.image_width}, now {current.image_height}x{current.image_width}")
    if saved.tags_hash != current.tags_hash:
        counts = (f"{saved.tag_count} tags then, {current.tag_count} now" if saved.tag_count != current.tag_count
                  else f"{current.tag_count} tags then and now: other names or another order")
        changes.append(f"{tags_path}: content changed ({counts})")
    if saved.trainable_blocks != current.trainable_blocks:
        changes.append(f"{config_path}: trainable_blocks was {_shown(saved.trainable_blocks)}, "
                       f"now {_shown(current.trainable_blocks)}")
    if changes:
        raise TrainingError(
            f"{checkpoint_dir}: the checkpoint was trained for a different setup: {'; '.join(changes)}. "
            f"Restore the old setting to resume, or delete {checkpoint_dir} to start fresh")


def _shown(blocks: int | None) -> str:
    return "null" if blocks is None else str(blocks)


def write_state_json(checkpoint_dir, checkpoint_path: str, counters: Counters, identity: RunIdentity,
                     *, complete: bool, epoch_count: int, train_records: int, records_hash: str = "",
                     network: dict | None = None, split: dict | None = None) -> Path:
    path = Path(checkpoint_dir) / STATE_FILE
    data = {"version": STATE_VERSION, "checkpoint": Path(checkpoint_path).name, **asdict(counters),
            "complete": complete, **asdict(identity), "epoch_count": epoch_count,
            "train_records": train_records, "records_hash": records_hash, **(network or {}), **(split or {})}
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_state_json(checkpoint_dir) -> tuple[dict | None, str | None]:
    """(state, None), (None, None) when there is no state.json, or (None, why it cannot be used)."""
    path = Path(checkpoint_dir) / STATE_FILE
    if not path.is_file():
        return None, None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return None, f"{path}: cannot be read: {error}"
    if not isinstance(state, dict):
        return None, f"{path}: does not hold a JSON object"
    if state.get("version") != STATE_VERSION:
        return None, f"{path}: version {state.get('version')!r} is not one this version of deepdanbooru reads"
    return state, None
