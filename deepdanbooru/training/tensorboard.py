"""TensorBoard event files: logs/train (per console line) and logs/validation (per validation).

    tensorboard --logdir PROJECT/logs

The step of every point is used_minibatch. The two runs share tag names
where they measure the same thing (loss), so TensorBoard draws training and
validation loss on one chart.

Resume-aware by purging: a run killed after its last checkpoint leaves
points for steps the resumed run trains again. On start, every event with a
step above the restored used_minibatch is removed from the existing files
(each affected file is rewritten atomically; a file left with no point is
deleted), a new file is started, and only steps above the restored counter
are written. Every tag's steps therefore increase strictly across the files
in name (= creation) order, whatever TensorBoard version reads them.

Writing needs no `tensorboard` package (only viewing does): points are
written with tf.summary.write and the metadata TensorBoard's scalar plugin
gives its own, so they read back exactly as tf.summary.scalar's would.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
from pathlib import Path

import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

from deepdanbooru.training.history import restored_step
from deepdanbooru.training.monitors import Monitor

TRAIN_TAGS = ("loss", "precision", "recall", "f1", "learning_rate", "samples_per_second")
# Validation scalars that describe the setup rather than the model: constant within a run.
NOT_PLOTTED = frozenset({"samples", "tags", "tags_with_positives", "positives", "threshold", "bins", "min_support",
                         "pr_tags", "general_pr_tags", "character_pr_tags"})

# What tensorboard.summary.scalar attaches: the "scalars" plugin (its data version 0 serialises to no bytes).
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR,
).SerializeToString()


def write_scalar(name: str, value: float, step: int) -> None:
    """One scalar point into the default summary writer."""
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA)


def event_files(directory) -> list[Path]:
    """Event files in creation order.

    Names are events.out.tfevents.<seconds>.<host>.<pid>.<counter>[.v2]: two files of one second
    (a resumed run starting quickly) differ only in the counter, which must compare as a number.
    """
    def creation(path: Path):
        stem = path.name[len("events.out.tfevents."):].removesuffix(".v2")
        seconds, _, rest = stem.partition(".")
        try:
            _, pid, counter = rest.rsplit(".", 2)
            return (int(seconds), int(pid), int(counter), path.name)
        except ValueError:
            return (0, 0, 0, path.name)

    return sorted(Path(directory).glob("events.out.tfevents.*"), key=creation)


def _records(path: Path) -> list[bytes]:
    records = []
    try:
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            records.append(record)
    except tf.errors.DataLossError:
        # A kill mid-write leaves a torn last record; what precedes it is intact.
        pass
    return records


def purge_events(directory, after_step: int) -> int:
    """Remove every summary event with step > after_step from the event files; return how many were removed.

    Files are visited newest first and the walk stops at the first file with
    nothing to remove: earlier runs were purged the same way when this one's
    predecessors resumed, so older files hold only older steps.
    """
    removed = 0
    for path in reversed(event_files(directory)):
        records = _records(path)
        kept = []
        points = 0
        for record in records:
            event = event_pb2.Event.FromString(record)
            if event.HasField("summary") and event.step > after_step:
                continue
            kept.append(record)
            points += event.HasField("summary")
        dropped = len(records) - len(kept)
        if not dropped and points:
            break
        removed += dropped
        if not points:
            path.unlink()
            continue
        partial = path.with_name(f".purge-{os.getpid()}.tmp")
        with tf.io.TFRecordWriter(str(partial)) as writer:
            for record in kept:
                writer.write(record)
        os.replace(partial, path)
    return removed


def tensorboard_command(logs_dir) -> str:
    """The line to paste; the viewer is an optional extra, so say how to get it when it is missing."""
    command = f"tensorboard --logdir {shlex.quote(str(logs_dir))}"
    if importlib.util.find_spec("tensorboard") is None:
        command += "  (not installed: pip install -e '.[tensorboard]' in the clone, or pip install tensorboard)"
    return command


class TensorBoardMonitor(Monitor):
    def __init__(self, logs_dir, echo=print):
        self.train_dir = Path(logs_dir) / "train"
        self.validation_dir = Path(logs_dir) / "validation"
        self.echo = echo
        self.after = 0
        self._writers: dict[Path, tf.summary.SummaryWriter] = {}

    def on_train_begin(self, run):
        self.echo(f"TensorBoard: {tensorboard_command(self.train_dir.parent)}")
        self.after = restored_step(run)
        removed = sum(purge_events(directory, self.after) for directory in (self.train_dir, self.validation_dir)
                      if directory.is_dir())
        if removed:
            why = (f"past step {self.after} written by an earlier run that did not reach its next checkpoint"
                   if self.after >= 0 else "written by an earlier run (this one starts fresh)")
            self.echo(f"notice: removed {removed} TensorBoard point(s) {why}")

    def _writer(self, directory: Path):
        # Created on first use: a run without validation leaves no empty validation file.
        writer = self._writers.get(directory)
        if writer is None:
            directory.mkdir(parents=True, exist_ok=True)
            writer = self._writers[directory] = tf.summary.create_file_writer(str(directory))
        return writer

    def _scalars(self, directory: Path, step: int, values: dict) -> None:
        if step <= self.after:
            return
        with self._writer(directory).as_default():
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                    write_scalar(name, float(value), step)

    def on_step_log(self, log):
        self._scalars(self.train_dir, log.progress.used_minibatch, {
            "loss": log.loss, "precision": log.precision, "recall": log.recall, "f1": log.f1,
            "learning_rate": log.learning_rate, "samples_per_second": log.samples_per_second})

    def on_validation(self, report, logs):
        self._scalars(self.validation_dir, report.progress.used_minibatch,
                      {name: value for name, value in report.metrics.items() if name not in NOT_PLOTTED})

    def before_checkpoint(self, progress, logs):
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, progress):
        self.before_checkpoint(progress, {})

    def close(self):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
