"""Monitors driven with crafted events: TensorBoard, history, best model, console lines; gradient clipping."""

import json
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from deepdanbooru.training.best import BestModelMonitor, BestState, best_json_path
from deepdanbooru.training.history import HistoryMonitor, read_history, truncate_history
from deepdanbooru.scoring.metrics import ValidationMetrics
from deepdanbooru.training.monitors import (
    ConsoleMonitor,
    Progress,
    RunInfo,
    StepLog,
    ValidationReport,
    final_validation_line,
    validation_cost_notice,
    validation_plan_line,
)
from deepdanbooru.training.tensorboard import (
    NOT_PLOTTED,
    TRAIN_TAGS,
    TensorBoardMonitor,
    event_files,
    purge_events,
)

N_TAGS = 3


def progress(step: int) -> Progress:
    return Progress(used_epoch=0, used_minibatch=step, used_sample=4 * step, offset=4 * step, random_seed=0,
                    epoch_count=1, train_records=100)


def run_info(tmp_path, resumed_at=None, validation_records=4, fraction=0.25, model=None) -> RunInfo:
    return RunInfo(project=tmp_path, model_name="resnet_small", input_shape=(32, 32, 3), batch_size=4,
                   epoch_count=1, train_records=100, validation_records=validation_records, slice_records=8,
                   slices_per_epoch=13, policy="float32",
                   resumed_from=None if resumed_at is None else f"ckpt-{resumed_at}",
                   start=progress(resumed_at or 0), validation_fraction=fraction, validation_frequency_slices=2,
                   best_model_metric="macro_f1", config_path=tmp_path / "project.json",
                   model=model)


def step_log(step: int, loss: float) -> StepLog:
    return StepLog(progress=progress(step), loss=loss, precision=0.5, recall=0.25, f1=1 / 3,
                   samples_per_second=100.0 + step, eta_seconds=1.0, fraction=step / 25, learning_rate=0.001)


def crafted_result(**overrides) -> dict:
    """A real ValidationMetrics result on four images, with chosen scalars replaced."""
    metrics = ValidationMetrics(N_TAGS, threshold=0.5)
    labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], np.float32)
    scores = np.array([[0.9, 0.2, 0.4], [0.1, 0.7, 0.6], [0.8, 0.3, 0.2], [0.2, 0.1, 0.9]], np.float32)
    metrics.update(scores, labels, loss_sum=2.0)
    return {**metrics.result(), **overrides}


def report(step: int, trigger="slice", **overrides) -> ValidationReport:
    return ValidationReport(progress=progress(step), trigger=trigger, result=crafted_result(**overrides), records=4,
                            skipped=0, seconds=0.5)


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] over every event file in creation order, read with summary_iterator."""
    points: dict[str, list[tuple[int, float]]] = {}
    plugins = set()
    for path in event_files(directory):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
                if value.metadata.plugin_data.plugin_name:
                    plugins.add((value.tag, value.metadata.plugin_data.plugin_name))
    assert {tag for tag, _ in plugins} == set(points) and {name for _, name in plugins} == {"scalars"}
    return points


# --- TensorBoard ---


def test_tensorboard_scalars_and_resume_purge(tmp_path):
    logs = tmp_path / "logs"
    first = TensorBoardMonitor(logs)
    first.on_train_begin(run_info(tmp_path))
    for step in range(1, 7):
        first.on_step_log(step_log(step, loss=float(step)))
        if step % 2 == 0:
            first.on_validation(report(step, macro_f1=step / 10), {})
    first.close()  # what a killed run left: steps 5 and 6 were never covered by a checkpoint

    lines = []
    resumed = TensorBoardMonitor(logs, echo=lines.append)
    resumed.on_train_begin(run_info(tmp_path, resumed_at=4))
    # Steps 5 and 6 of every training tag, and the validation at step 6.
    removed = 2 * len(TRAIN_TAGS) + len(set(report(6).metrics) - NOT_PLOTTED)
    assert lines[0].startswith(f"TensorBoard: tensorboard --logdir {logs}")  # the command to view them
    assert lines[1:] == [f"notice: removed {removed} TensorBoard point(s) past step 4 written by an earlier run that "
                         "did not reach its next checkpoint"]
    for step in range(3, 9):  # steps <= 4 are not written again
        resumed.on_step_log(step_log(step, loss=100.0 + step))
        if step % 2 == 0:
            resumed.on_validation(report(step, macro_f1=1 + step / 10), {})
    resumed.close()

    train = read_scalars(logs / "train")
    assert set(train) == set(TRAIN_TAGS)
    assert [step for step, _ in train["loss"]] == list(range(1, 9))
    assert [value for _, value in train["loss"]] == [1, 2, 3, 4, 105, 106, 107, 108]
    assert train["learning_rate"][0] == (1, pytest.approx(0.001))
    assert train["samples_per_second"][-1] == (8, 108.0)
    validation = read_scalars(logs / "validation")
    for tag in ("loss", "micro_f1", "macro_f1", "map", "mcc", "micro_precision", "macro_recall",
                "global_threshold", "global_threshold_f1", "calibrated_macro_f1"):
        assert [step for step, _ in validation[tag]] == [2, 4, 6, 8], tag
    assert [value for _, value in validation["macro_f1"]] == pytest.approx([0.2, 0.4, 1.6, 1.8])
    assert validation["loss"][0][1] == pytest.approx(0.5)  # 2.0 summed over 4 images
    assert "bins" not in validation and "samples" not in validation
    assert len(event_files(logs / "train")) == 2  # a new file per process


def test_purge_handles_a_torn_record_and_deletes_emptied_files(tmp_path):
    monitor = TensorBoardMonitor(tmp_path)
    monitor.on_train_begin(run_info(tmp_path))
    for step in (1, 2, 3):
        monitor.on_step_log(step_log(step, loss=float(step)))
    monitor.close()
    (path,) = event_files(tmp_path / "train")
    with open(path, "ab") as stream:
        stream.write(b"\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # a record header with no body: a kill mid-write
    assert purge_events(tmp_path / "train", after_step=1) == 2 * len(TRAIN_TAGS)
    assert [step for step, _ in read_scalars(tmp_path / "train")["loss"]] == [1]
    assert purge_events(tmp_path / "train", after_step=0) == len(TRAIN_TAGS)
    assert event_files(tmp_path / "train") == []


def test_tensorboard_fresh_start_after_deleting_checkpoints_clears_old_points(tmp_path):
    old = TensorBoardMonitor(tmp_path)
    old.on_train_begin(run_info(tmp_path))
    old.on_step_log(step_log(1, 1.0))
    old.close()
    fresh = TensorBoardMonitor(tmp_path, echo=lambda _: None)
    fresh.on_train_begin(run_info(tmp_path))
    fresh.on_step_log(step_log(1, 9.0))
    fresh.close()
    assert read_scalars(tmp_path / "train")["loss"] == [(1, 9.0)]


# --- history.jsonl ---


def test_history_lines_and_resume(tmp_path):
    path = tmp_path / "logs" / "history.jsonl"
    first = HistoryMonitor(path)
    first.on_train_begin(run_info(tmp_path))
    for step in range(1, 7):
        first.on_step_log(step_log(step, loss=float(step)))
        if step % 2 == 0:
            first.on_validation(report(step, macro_f1=step / 10), {"best": {"metric": "macro_f1"}} if step == 2 else {})
    first.close()
    with open(path, "a") as stream:
        stream.write('{"kind": "train", "used_minibatch": 7, "lo')  # torn by a kill

    lines = []
    resumed = HistoryMonitor(path, echo=lines.append)
    resumed.on_train_begin(run_info(tmp_path, resumed_at=4))
    assert lines == [f"notice: {path}: dropped 4 line(s) written after the checkpoint at step 4 by an earlier run"]
    for step in range(3, 9):
        resumed.on_step_log(step_log(step, loss=100.0 + step))
        if step % 2 == 0:
            resumed.on_validation(report(step), {})
    resumed.close()

    records = read_history(path)
    keys = [(r["kind"], r["used_minibatch"]) for r in records]
    assert keys == [("train", 1), ("train", 2), ("validation", 2), ("train", 3), ("train", 4), ("validation", 4),
                    ("resume", 4), ("train", 5), ("train", 6), ("validation", 6), ("train", 7), ("train", 8),
                    ("validation", 8)]
    steps = [r["used_minibatch"] for r in records]
    assert steps == sorted(steps)
    # The killed run wrote no stop line: its last complete line (the validation at step 6) is where it was seen.
    resume = records[6]
    assert (resume["stopped_by"], resume["stopped_step"], resume["repeated_steps"]) == ("killed", 6, 2)
    assert resume["offset"] == 16 and resume["used_sample"] == 16  # the checkpoint's counters
    assert [r["loss"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 105, 106, 107, 108]
    train = records[0]
    assert train["used_sample"] == 4 and train["learning_rate"] == 0.001 and train["samples_per_second"] == 101.0
    assert {"used_epoch", "used_minibatch", "used_sample", "offset", "random_seed", "time", "precision",
            "recall", "f1", "progress"} <= set(train)
    validation = records[2]
    assert validation["trigger"] == "slice" and validation["new_best"] is True and records[5]["new_best"] is False
    assert validation["macro_f1"] == pytest.approx(0.2) and validation["loss"] == pytest.approx(0.5)
    assert validation["validation_records"] == 4 and validation["skipped_images"] == 0
    assert "per_tag" not in validation


def test_truncate_history_keeps_only_complete_lines_up_to_the_step(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"used_minibatch": 1}\nnot json\n{"used_minibatch": 3}\n{"used_minibatch": 2}\n[1]\n')
    assert truncate_history(path, 2) == 3
    assert path.read_text() == '{"used_minibatch": 1}\n{"used_minibatch": 2}\n'
    assert truncate_history(path, 2) == 0
    assert truncate_history(tmp_path / "missing.jsonl", 0) == 0


def test_non_finite_training_loss_is_written_as_null(tmp_path):
    path = tmp_path / "history.jsonl"
    monitor = HistoryMonitor(path)
    monitor.on_train_begin(run_info(tmp_path))
    monitor.on_step_log(step_log(1, loss=float("nan")))
    monitor.close()
    assert read_history(path)[0]["loss"] is None


# --- best model ---


def tiny_model():
    inputs = keras.Input((2,))
    return keras.Model(inputs, keras.layers.Dense(N_TAGS, activation="sigmoid", name="out")(inputs))


def mark(model, value: float) -> None:
    """Give the weights a recognisable value, standing for the weights after some step."""
    model.get_layer("out").kernel.assign(np.full((2, N_TAGS), value, np.float32))


def saved_mark(path: Path) -> float:
    return float(keras.models.load_model(path).get_layer("out").kernel.numpy()[0, 0])


@pytest.mark.parametrize("metric, values, saved_at", [
    ("macro_f1", [0.2, 0.1, 0.3, 0.3, 0.25, 0.31], [1, 3, 6]),
    ("loss", [0.9, 1.0, 0.5, 0.5, float("nan"), 0.4], [1, 3, 6]),
])
def test_best_model_replaced_only_on_improvement(tmp_path, metric, values, saved_at):
    model = tiny_model()
    path = tmp_path / "model-tiny.best.keras"
    monitor = BestModelMonitor(path, metric, [f"t{i}" for i in range(N_TAGS)], echo=lambda _: None)
    monitor.on_train_begin(run_info(tmp_path, model=model))
    notes = []
    for step, value in enumerate(values, start=1):
        mark(model, step)
        logs = {}
        monitor.on_validation(report(step, **{metric: value}), logs)
        if logs:
            notes.append(step)
            assert saved_mark(path) == step
            assert logs["best"]["value"] == value and logs["best"]["metric"] == metric
        else:
            assert saved_mark(path) == notes[-1]  # untouched by a value that is not better
    assert notes == saved_at
    best = json.loads(best_json_path(path).read_text())
    assert best["value"] == values[saved_at[-1] - 1] and best["used_minibatch"] == saved_at[-1]
    assert best["previous"] == values[saved_at[-2] - 1] and best["metrics"][metric] == best["value"]
    assert (tmp_path / "model-tiny.best.thresholds.csv").read_text().splitlines()[0] == \
        "tag,threshold,precision,recall,f1,support,ap,use,reason"
    assert json.loads((tmp_path / "model-tiny.best.metrics.json").read_text())["used_minibatch"] == saved_at[-1]
    assert not list(tmp_path.glob(".*"))  # no temporary left
    assert monitor.state.get().value == values[saved_at[-1] - 1]


def test_best_value_survives_a_checkpoint_round_trip(tmp_path):
    model = tiny_model()
    path = tmp_path / "model-tiny.best.keras"
    tags = [f"t{i}" for i in range(N_TAGS)]
    first = BestModelMonitor(path, "macro_f1", tags)
    first.on_train_begin(run_info(tmp_path, model=model))
    mark(model, 1)
    first.on_validation(report(1, macro_f1=0.5), {})
    prefix = tf.train.Checkpoint(best=first.state).save(str(tmp_path / "ckpt"))

    lines = []
    resumed = BestModelMonitor(path, "macro_f1", tags, echo=lines.append)
    tf.train.Checkpoint(best=resumed.state).restore(prefix).assert_consumed()
    resumed.on_train_begin(run_info(tmp_path, resumed_at=1, model=model))
    assert lines == ["Best so far: macro_f1 0.5000 at step 1 (model-tiny.best.keras)"]
    mark(model, 2)
    logs = {}
    resumed.on_validation(report(2, macro_f1=0.4), logs)
    assert not logs and saved_mark(path) == 1  # a fresh monitor would have replaced it

    changed = BestModelMonitor(path, "map", tags, echo=lines.append)
    tf.train.Checkpoint(best=changed.state).restore(prefix)
    changed.on_train_begin(run_info(tmp_path, resumed_at=1, model=model))
    assert lines[-1] == "notice: best_model_metric changed from macro_f1 to map; model-tiny.best.keras will be " \
                        "replaced at the next validation"
    assert changed.best is None

    # The validation split changed: the saved value was measured on other posts, so the next validation replaces it.
    moved = BestModelMonitor(path, "macro_f1", tags, echo=lines.append)
    tf.train.Checkpoint(best=moved.state).restore(prefix)
    moved.on_train_begin(replace(run_info(tmp_path, resumed_at=1, model=model), split_changed=True))
    assert moved.best is None
    # Stopped before its next validation: the run after it (the split now as recorded) still chooses afresh,
    # reading neither the old value nor best.json.
    restarted = tf.train.Checkpoint(best=moved.state).save(str(tmp_path / "restarted"))
    later = BestModelMonitor(path, "macro_f1", tags, echo=lines.append)
    tf.train.Checkpoint(best=later.state).restore(restarted)
    later.on_train_begin(run_info(tmp_path, resumed_at=2, model=model))
    assert later.best is None and later.state.restarted
    mark(model, 3)
    logs = {}
    moved.on_validation(report(3, macro_f1=0.4), logs)
    assert logs["best"]["value"] == 0.4 and saved_mark(path) == 3


def test_the_start_of_a_fine_tune_is_the_first_best_and_best_json_keeps_it(tmp_path):
    model = tiny_model()
    path = tmp_path / "model-tiny.best.keras"
    tags = [f"t{i}" for i in range(N_TAGS)]
    lines = []
    first = BestModelMonitor(path, "macro_f1", tags, echo=lines.append)
    first.on_train_begin(run_info(tmp_path, model=model))
    mark(model, 0)
    first.on_validation(report(0, trigger="start", macro_f1=0.3), {})
    mark(model, 2)
    first.on_validation(report(2, macro_f1=0.2), {})  # worse than the start: the best export stays the start
    assert saved_mark(path) == 0
    prefix = tf.train.Checkpoint(best=first.state).save(str(tmp_path / "ckpt"))
    first.on_train_stopped(progress(2))
    assert lines[-1] == ("Best: model-tiny.best.keras holds the starting weights (the source model as it was, "
                         "macro_f1 0.3000 at step 0); no validation since beat them")
    written = json.loads(best_json_path(path).read_text())
    assert written["used_minibatch"] == 0 and written["start"] == {"metric": "macro_f1", "value": 0.3,
                                                                   "used_minibatch": 0}

    resumed = BestModelMonitor(path, "macro_f1", tags, echo=lines.append)
    tf.train.Checkpoint(best=resumed.state).restore(prefix).assert_consumed()
    resumed.on_train_begin(run_info(tmp_path, resumed_at=2, model=model))
    assert lines[-1] == "Best so far: macro_f1 0.3000 at step 0 (model-tiny.best.keras)"
    mark(model, 4)
    resumed.on_validation(report(4, macro_f1=0.35), {})
    resumed.on_train_end(progress(4))
    assert saved_mark(path) == 4 and not lines[-1].startswith("Best: ")
    written = json.loads(best_json_path(path).read_text())
    assert (written["used_minibatch"], written["previous"]) == (4, 0.3)
    assert written["start"] == {"metric": "macro_f1", "value": 0.3, "used_minibatch": 0}  # carried over the resume


def test_history_of_a_fresh_run_starts_at_step_0_and_keeps_nothing_of_an_earlier_one(tmp_path):
    path = tmp_path / "logs" / "history.jsonl"
    for attempt in range(2):  # the second fresh start (checkpoints deleted) drops the first one's lines
        monitor = HistoryMonitor(path, echo=lambda _: None)
        monitor.on_train_begin(run_info(tmp_path))
        monitor.on_validation(report(0, trigger="start"), {})
        monitor.on_step_log(step_log(1, loss=1.0))
        monitor.close()
    assert [(r["kind"], r["used_minibatch"]) for r in read_history(path)] == [("validation", 0), ("train", 1)]
    resumed = HistoryMonitor(path, echo=lambda _: None)
    resumed.on_train_begin(run_info(tmp_path, resumed_at=1))
    resumed.on_step_log(step_log(2, loss=1.0))
    resumed.close()
    assert [(r["kind"], r["used_minibatch"]) for r in read_history(path)] == [
        ("validation", 0), ("train", 1), ("resume", 1), ("train", 2)]


def test_history_records_each_stop_and_what_the_resumed_run_went_on_from(tmp_path):
    path = tmp_path / "logs" / "history.jsonl"

    def run(resumed_at, steps, end):
        monitor = HistoryMonitor(path, echo=lambda _: None)
        monitor.on_train_begin(run_info(tmp_path, resumed_at=resumed_at))
        for step in steps:
            monitor.on_step_log(step_log(step, loss=1.0))
        if end == "time limit":
            monitor.on_train_stopped(progress(steps[-1]))
        elif end == "Ctrl-C":
            monitor.on_interrupted(progress(steps[-1]))
        monitor.close()  # "killed": nothing more is written

    run(None, [1, 2], "time limit")  # stopped by its limit at its checkpoint, step 2
    run(2, [3, 4, 5], "Ctrl-C")  # interrupted at step 5, its last checkpoint at step 4
    run(4, [5, 6, 7], "killed")  # killed after step 7, its last checkpoint at step 6
    run(6, [7, 8], "time limit")
    rows = read_history(path)
    assert [(r["kind"], r["used_minibatch"]) for r in rows] == [
        ("train", 1), ("train", 2), ("stop", 2), ("resume", 2), ("train", 3), ("train", 4), ("resume", 4),
        ("train", 5), ("train", 6), ("resume", 6), ("train", 7), ("train", 8), ("stop", 8)]
    stop, *resumes = [r for r in rows if r["kind"] in ("stop", "resume")][:4]
    assert stop["reason"] == "time limit"
    assert [(r["stopped_by"], r["stopped_step"], r["repeated_steps"]) for r in resumes] == [
        ("time limit", 2, 0), ("Ctrl-C", 5, 1), ("killed", 7, 1)]
    assert all(r["stopped_time"] <= r["time"] for r in resumes)
    assert rows[-1]["reason"] == "time limit"
    # The report reads them as the run went.
    from deepdanbooru.report.summary import stops

    assert [stop.text().split(" after ")[0] for stop in stops(rows)] == [
        "the time limit at step 2, resumed from the checkpoint at step 2",
        "Ctrl-C at step 5, resumed from the checkpoint at step 4",
        "killed or crashed (no stop recorded) at step 7, resumed from the checkpoint at step 6",
        "the time limit at step 8, not resumed yet"]


def test_best_state_starts_empty():
    assert BestState().get() is None


# --- console ---


def test_validation_plan_and_final_lines(tmp_path):
    on = validation_plan_line(run_info(tmp_path))
    assert on == ("Validation: 4 records held out (validation_fraction 0.25), never trained on; validated after "
                  "every 2 slice(s) and at each epoch end; best model by macro_f1")
    off = validation_plan_line(run_info(tmp_path, validation_records=0, fraction=0.0))
    assert off.startswith("Validation: off. ") and '"validation_fraction": 0.05' in off
    assert str(tmp_path / "project.json") in off
    empty = validation_plan_line(run_info(tmp_path, validation_records=0, fraction=0.01))
    assert "selected none of the 100 eligible records" in empty
    line = final_validation_line(report(12, micro_f1=0.5, macro_f1=0.25, map=0.75))
    assert line.startswith("Final validation (step 12, 4 records): micro-F1 0.5000, macro-F1 0.2500, mAP 0.7500, "
                           "loss 0.5000, MCC ")


def test_validation_cost_notice(tmp_path):
    # 4 of 100 records, 13 slices, every 2 slices: 7 passes x 4 / 4.5 / 100 = 6%: no notice.
    assert validation_cost_notice(run_info(tmp_path)) is None
    assert validation_cost_notice(run_info(tmp_path, validation_records=0, fraction=0.0)) is None
    heavy = validation_cost_notice(run_info(tmp_path, validation_records=10))
    assert heavy == ("notice: validation will take about 16% of the training time (7 pass(es) of 10 records per "
                     f"epoch of 100); raise validation_frequency_slices in {tmp_path / 'project.json'} (0: epoch "
                     "ends only) or lower validation_fraction")
    epoch_end_only = replace(run_info(tmp_path, validation_records=50), validation_frequency_slices=0)
    assert validation_cost_notice(epoch_end_only) == (
        "notice: validation will take about 11% of the training time (1 pass(es) of 50 records per epoch of 100); "
        f"lower validation_fraction in {tmp_path / 'project.json'}")
    lines = []
    ConsoleMonitor(echo=lines.append).on_train_begin(run_info(tmp_path, validation_records=10))
    assert lines[2] == heavy


def test_console_prints_each_validation_and_the_final_one_last(tmp_path):
    lines = []
    console = ConsoleMonitor(lines.append)
    console.on_train_begin(run_info(tmp_path))
    console.on_validation(report(4), {"best": {"metric": "macro_f1", "path": str(tmp_path / "m.best.keras")}})
    console.on_validation(report(8, micro_f1=0.625), {})
    console.on_train_end(progress(8))
    assert lines[1].startswith("Validation: 4 records held out")
    assert lines[-4].startswith("Validation at step 4 (4 records): loss 0.5000 micro-F1 ")
    assert lines[-4].endswith("; new best macro_f1, saved m.best.keras")
    assert lines[-2].startswith("Training complete: ")
    assert lines[-1].startswith("Final validation (step 8, 4 records): micro-F1 0.6250, ")


def test_a_time_limit_stop_calls_its_figures_the_stop_not_final(tmp_path):
    lines = []
    console = ConsoleMonitor(lines.append)
    console.on_train_begin(run_info(tmp_path))
    console.on_validation(report(8, micro_f1=0.625), {})
    console.on_train_stopped(progress(8))
    assert lines[-1].startswith("Validation at the stop (step 8, 4 records): micro-F1 0.6250, ")
    assert not any(line.startswith("Final") for line in lines)


def test_console_without_validation_ends_with_training_complete(tmp_path):
    lines = []
    console = ConsoleMonitor(lines.append)
    console.on_train_end(progress(3))
    assert lines == ["Training complete: 0 epoch(s), 3 steps, 12 samples"]


# --- gradient clipping ---


def _one_step_update(policy: str, clip, learning_rate=0.1) -> float:
    """Norm of the change of all weights after one SGD step of the trainer's TrainStep on a tiny model."""
    from deepdanbooru.models import make_optimizer
    from deepdanbooru.models.precision import MIXED, global_policy
    from deepdanbooru.training.step import TrainStep, build_optimizer

    keras.utils.set_random_seed(0)
    with global_policy(policy):
        inputs = keras.Input((4, 4, 3))
        hidden = keras.layers.Flatten()(inputs)
        outputs = keras.layers.Dense(8, activation="sigmoid", dtype="float32")(hidden)
        model = keras.Model(inputs, outputs)
    strategy = tf.distribute.get_strategy()
    optimizer, _ = build_optimizer(lambda: make_optimizer("sgd", learning_rate, global_clipnorm=clip),
                                   policy == MIXED)
    optimizer.build(model.trainable_variables)
    before = [w.copy() for w in model.get_weights()]
    rng = np.random.default_rng(0)
    batch = {"image": rng.random((2, 4, 4, 3), dtype=np.float32),
             "label": (rng.random((2, 8)) < 0.5).astype(np.float32), "position": np.arange(2, dtype=np.int64)}
    distributed = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch))
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=policy == MIXED)
    step.bind(distributed.element_spec)
    for element in distributed:
        step(element)
    assert step.sums.first_bad() is None
    return float(np.sqrt(sum(((after - b) ** 2).sum() for after, b in zip(model.get_weights(), before))))


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_clipping_bounds_the_update_after_loss_scale_unscaling(policy):
    clip, rate = 0.01, 0.1
    # SGD with Nesterov momentum 0.9 moves the weights by 1.9 x rate x gradient on its first step.
    bound = 1.9 * rate * clip
    unclipped = _one_step_update(policy, None, rate)
    assert unclipped > 20 * bound  # the gradient really is larger than the clip norm
    clipped = _one_step_update(policy, clip, rate)
    # Equal to the bound, not below it: clipping the loss-scaled gradient (2**15 times too large) would
    # have left an update 2**15 times smaller.
    assert clipped == pytest.approx(bound, rel=2e-3 if policy == "float32" else 2e-2)
