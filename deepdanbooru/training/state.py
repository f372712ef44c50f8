"""Resume state: the SPEC counters and what the checkpoint was trained for.

Both live as tf.Variables inside every checkpoint (so they can never disagree
with the weights saved beside them) and are mirrored, after each checkpoint
is complete, to checkpoints/state.json for tools that must not import
TensorFlow (preflight). state.json is informational: if a run dies between
the checkpoint and the mirror, the checkpoint is still the truth.

state.json format (version 1), all keys always present:
    {"version": 1, "checkpoint": "<prefix file name in checkpoints/>",
     "used_epoch": int, "used_minibatch": int, "used_sample": int, "offset": int,
     "random_seed": int, "epoch_bad_images": int, "complete": bool,
     "model": str, "image_height": int, "image_width": int,
     "tags_hash": str, "tag_count": int, "epoch_count": int, "train_records": int,
     "records_hash": str (training.split.records_hash; absent in files written before it existed)}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tensorflow as tf

from deepdanbooru.errors import TrainingError
from deepdanbooru.project.create import write_text_atomic

STATE_FILE = "state.json"
STATE_VERSION = 1


@dataclass
class Counters:
    """SPEC section 5's counters, plus the bad images seen so far in this epoch (ours)."""

    used_epoch: int = 0
    used_minibatch: int = 0
    used_sample: int = 0
    offset: int = 0
    random_seed: int = 0
    epoch_bad_images: int = 0


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint's weights mean; resuming with any of these changed is refused."""

    model: str
    image_height: int
    image_width: int
    tags_hash: str
    tag_count: int


class ResumeState(tf.Module):
    """The tf.Variables a checkpoint carries next to model and optimizer.

    Create it outside any strategy scope: these are host-side values the
    Python loop assigns right before each save, never touched by a step.
    """

    def __init__(self):
        super().__init__(name="resume_state")
        for field in fields(Counters):
            setattr(self, field.name, tf.Variable(0, dtype=tf.int64, trainable=False, name=field.name))
        self.model = tf.Variable("", dtype=tf.string, trainable=False, name="model")
        self.image_height = tf.Variable(0, dtype=tf.int64, trainable=False, name="image_height")
        self.image_width = tf.Variable(0, dtype=tf.int64, trainable=False, name="image_width")
        self.tags_hash = tf.Variable("", dtype=tf.string, trainable=False, name="tags_hash")
        self.tag_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="tag_count")
        # A short hash of the training ids: a changed database is noticed on resume, not refused.
        self.records_hash = tf.Variable("", dtype=tf.string, trainable=False, name="records_hash")

    def assign(self, counters: Counters, identity: RunIdentity, records_hash: str = "") -> None:
        for field in fields(Counters):
            getattr(self, field.name).assign(getattr(counters, field.name))
        self.model.assign(identity.model)
        self.image_height.assign(identity.image_height)
        self.image_width.assign(identity.image_width)
        self.tags_hash.assign(identity.tags_hash)
        self.tag_count.assign(identity.tag_count)
        self.records_hash.assign(records_hash)

    def counters(self) -> Counters:
        return Counters(**{field.name: int(getattr(self, field.name).numpy()) for field in fields(Counters)})

    def identity(self) -> RunIdentity:
        return RunIdentity(
            model=self.model.numpy().decode("utf-8"),
            image_height=int(self.image_height.numpy()),
            image_width=int(self.image_width.numpy()),
            tags_hash=self.tags_hash.numpy().decode("utf-8"),
            tag_count=int(self.tag_count.numpy()),
        )


def read_checkpoint_state(checkpoint_path: str) -> tuple[Counters, RunIdentity]:
    """Counters and identity of a checkpoint, without building its model."""
    state = ResumeState()
    tf.train.Checkpoint(state=state).read(checkpoint_path).expect_partial()
    return state.counters(), state.identity()


def check_identity(saved: RunIdentity, current: RunIdentity, checkpoint_dir, tags_path, config_path) -> None:
    """Refuse to resume a checkpoint trained for something else, saying what changed."""
    changes = []
    if saved.model != current.model:
        changes.append(f"{config_path}: model was {saved.model!r}, now {current.model!r}")
    if (saved.image_height, saved.image_width) != (current.image_height, current.image_width):
        changes.append(f"{config_path}: input size (image_height x image_width) was "
                       f"{saved.image_height}x{saved.image_width}, now {current.image_height}x{current.image_width}")
    if saved.tags_hash != current.tags_hash:
        changes.append(f"{tags_path}: content changed ({saved.tag_count} tags then, {current.tag_count} now)")
    if changes:
        raise TrainingError(
            f"{checkpoint_dir}: the checkpoint was trained for a different setup: {'; '.join(changes)}. "
            f"Restore the old setting to resume, or delete {checkpoint_dir} to start fresh")


def write_state_json(checkpoint_dir, checkpoint_path: str, counters: Counters, identity: RunIdentity,
                     *, complete: bool, epoch_count: int, train_records: int, records_hash: str = "") -> Path:
    path = Path(checkpoint_dir) / STATE_FILE
    data = {"version": STATE_VERSION, "checkpoint": Path(checkpoint_path).name, **asdict(counters),
            "complete": complete, **asdict(identity), "epoch_count": epoch_count,
            "train_records": train_records, "records_hash": records_hash}
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


def read_state_json(checkpoint_dir) -> dict | None:
    """The mirrored state, or None when there is none or it is not a version this code wrote."""
    path = Path(checkpoint_dir) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("version") == STATE_VERSION else None
