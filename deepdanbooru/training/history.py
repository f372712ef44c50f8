"""logs/history.jsonl: one JSON object per console line ("train") and per validation ("validation").

Every object carries the counters used_epoch, used_minibatch, used_sample,
offset and random_seed of the weights it describes, and "time" (Unix
seconds). Objects appear in step order; a validation follows the train line
of the same step.

Resume-aware: lines past the checkpoint a run starts from were written by a
run that died before saving them, and the resumed run trains those steps
again. On start every line with used_minibatch above the restored counter
is dropped (the file is rewritten atomically), and only steps above it are
written, so the file never holds a step twice or out of order. A torn last
line (a kill mid-write) is dropped too. A fresh run drops every line: its
first may be the step-0 validation of a fine-tune's start (training.start).

Stops are lines too. A run stopped by Ctrl-C or its --time-limit writes a
"stop" line (reason "Ctrl-C" or "time limit", at the step it reached). A
resumed run writes a "resume" line at the step of its checkpoint, saying how
the run before it stopped: from that run's last line, its stop line, or, when
the last line is no stop (the process was killed, crashed, or the machine went
down), reason "killed" at the time of its last line. Its fields: stopped_by,
stopped_step (the step the stopped run had reached), stopped_time, and
repeated_steps (the steps after the checkpoint, trained again).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.runstate.state import SCHEDULE_COUNTERS
from deepdanbooru.scoring.metrics import json_ready
from deepdanbooru.training.monitors import Monitor, Progress



def counters(progress: Progress) -> dict:
    return {name: getattr(progress, name) for name in SCHEDULE_COUNTERS}


def restored_step(run) -> int:
    """used_minibatch of the checkpoint a run starts from; -1 for a fresh run, which keeps nothing of an
    earlier one and writes from step 0 on (the validation of a fine-tune's start is at step 0)."""
    return run.start.used_minibatch if run.resumed_from else -1


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("used_minibatch") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def truncate_history(path, after_step: int) -> int:
    """Keep only the complete lines with used_minibatch <= after_step; return how many were dropped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0
    except UnicodeDecodeError:
        text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    kept = []
    for line in lines:
        step = _step_of(line) if line.endswith("\n") else None
        if step is not None and step <= after_step:
            kept.append(line)
    dropped = len(lines) - len(kept)
    if dropped:
        write_text_atomic(path, "".join(kept))
    return dropped


STOP, RESUME = "stop", "resume"
INTERRUPT, TIME_LIMIT, KILLED = "Ctrl-C", "time limit", "killed"


def last_record(path) -> dict | None:
    """The last complete object of the file (None: no file, or none)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        if line.endswith("\n") and line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                return record
    return None


def resume_record(last: dict | None, start: dict, now: float) -> dict:
    """The "resume" line of a run resumed at counters `start`, after the run whose last line was `last`."""
    step = start["used_minibatch"]
    if last is not None and last.get("kind") == STOP:
        stopped_by = last.get("reason") or KILLED
    else:
        stopped_by = KILLED  # no stop line: the process ended without writing one
    reached = last.get("used_minibatch") if last is not None else None
    reached = reached if isinstance(reached, int) and reached >= step else step
    stopped_time = last.get("time") if last is not None and isinstance(last.get("time"), (int, float)) else None
    return {"kind": RESUME, "time": now, **start, "stopped_by": stopped_by, "stopped_step": reached,
            "stopped_time": stopped_time, "repeated_steps": reached - step}


def read_history(path) -> list[dict]:
    """Every object in the file, in order (for tests and tools)."""
    with open(path, encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def _finite_or_none(value):
    return value if value is None or math.isfinite(value) else None


class HistoryMonitor(Monitor):
    def __init__(self, path, echo=print):
        self.path = Path(path)
        self.echo = echo
        self.after = 0
        self._stream = None
        self._learning_rate = None

    def on_train_begin(self, run):
        self.after = restored_step(run)
        last = last_record(self.path) if run.resumed_from else None
        dropped = truncate_history(self.path, self.after)
        if dropped:
            origin = f"the checkpoint at step {self.after}" if run.resumed_from else "a fresh start (no checkpoint)"
            self.echo(f"notice: {self.path}: dropped {dropped} line(s) written after {origin} by an earlier run")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = open(self.path, "a", encoding="utf-8")
        if run.resumed_from:
            self._write(resume_record(last, counters(run.start), round(time.time(), 3)), always=True)

    def _write(self, record: dict, always: bool = False) -> None:
        """`always`: a stop or resume line, which repeats no earlier line of its step."""
        if self._stream is None or (record["used_minibatch"] <= self.after and not always):
            return
        self._stream.write(json.dumps(json_ready(record), allow_nan=False) + "\n")
        # Flushed per line, so a reader (tail -f, a notebook) sees it at once.
        self._stream.flush()

    def on_step_log(self, log):
        self._write({"kind": "train", "time": round(time.time(), 3), **counters(log.progress),
                     "loss": _finite_or_none(log.loss), "precision": log.precision, "recall": log.recall,
                     "f1": log.f1, "learning_rate": log.learning_rate,
                     "samples_per_second": log.samples_per_second, "progress": log.fraction})

    def on_validation(self, report, logs):
        self._write({"kind": "validation", "time": round(time.time(), 3), **counters(report.progress),
                     "trigger": report.trigger, "validation_records": report.records,
                     "skipped_images": report.skipped, "seconds": round(report.seconds, 3),
                     "new_best": bool(logs.get("best")), **report.metrics})

    def before_checkpoint(self, progress, logs):
        if self._stream is not None:
            self._stream.flush()
            os.fsync(self._stream.fileno())

    def on_train_end(self, progress):
        self.before_checkpoint(progress, {})

    def _stopped(self, progress, reason: str) -> None:
        self._write({"kind": STOP, "time": round(time.time(), 3), **counters(progress), "reason": reason},
                    always=True)
        self.before_checkpoint(progress, {})

    def on_train_stopped(self, progress):
        self._stopped(progress, TIME_LIMIT)

    def on_interrupted(self, progress):
        self._stopped(progress, INTERRUPT)

    def close(self):
        if self._stream is not None:
            self._stream.close()
            self._stream = None
