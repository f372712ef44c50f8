"""train-project --time-limit: the duration syntax, the stop decision, and a stopped run resuming exactly."""

import json

import pytest
from click.testing import CliRunner
from train_helpers import assert_same_weights, make_project, read_state, run_cli

from deepdanbooru.cli import main
from deepdanbooru.errors import TrainingError
from deepdanbooru.training.budget import MARGIN_SECONDS, TimeBudget, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("3h50m", 13800.0), ("900s", 900.0), ("90m", 5400.0), ("1h", 3600.0), ("1h2m3s", 3723.0), ("1.5h", 5400.0),
    (" 2M ", 120.0), ("0.5s", 0.5),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "3x", "m", "50m3h", "1h-5m", "0s", "0h0m", "1 hour"])
def test_bad_durations_are_one_line(text):
    with pytest.raises(TrainingError) as error:
        parse_duration(text)
    message = str(error.value)
    assert message.startswith("--time-limit: ") and "\n" not in message


def test_bad_time_limit_on_the_command_line_exits_2_before_training(tmp_path):
    result = CliRunner().invoke(main, ["train-project", str(tmp_path), "--time-limit", "3x"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --time-limit: '3x' is not a duration; write it as hours, minutes and seconds with units, "
        "e.g. 3h50m, 90m or 900s"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_another_slice_fits_only_with_room_for_the_slice_its_exports_and_the_margin():
    clock = Clock()
    budget = TimeBudget(1000.0, "1000s", clock=clock)
    margin = 0.01 * 1000 + MARGIN_SECONDS
    assert budget.margin == margin
    # The clock reading where a wait inside a slice (for a data-service batch) gives up.
    assert budget.deadline == 1000.0 + 1000.0 - margin
    clock.now += 5000  # nothing measured yet: the first slice always runs
    assert budget.another_slice_fits(exports=2)
    clock.now = 1000.0 + 300
    budget.slice_took(100.0)
    budget.slice_took(80.0)  # the longest slice counts
    budget.checkpoint_took(10.0)
    budget.validation_took(30.0)
    # No export measured yet: twice the longest checkpoint plus a validation pass.
    assert budget.export_estimate() == 2 * 10.0 + 30.0
    assert budget.needed(1) == 100.0 + 50.0 + margin
    clock.now = 1000.0 + 1000 - budget.needed(1)
    assert budget.another_slice_fits(exports=1)
    assert not budget.another_slice_fits(exports=2)
    clock.now += 0.5
    assert not budget.another_slice_fits(exports=1)
    budget.export_took(5.0)  # measured exports replace the estimate
    assert budget.export_estimate() == 5.0 and budget.another_slice_fits(exports=2)
    assert budget.too_small_notice("p/project.json") is None
    budget.slice_took(990.0)
    notice = budget.too_small_notice("p/project.json")
    assert "lower checkpoint_frequency_mb in p/project.json" in notice and "--time-limit 1000s" in notice


def test_the_eta_counts_to_the_time_limit_when_that_comes_first():
    from types import SimpleNamespace

    from deepdanbooru.runstate.state import Counters
    from deepdanbooru.training.reporting import RunReport

    class Records:  # 1,000 records an epoch, two epochs
        epoch_count = 2

        def done_records(self, used_epoch, position):
            return used_epoch * 1000 + position

    clock = Clock()
    budget = TimeBudget(600.0, "10m", clock=clock)
    report = RunReport(SimpleNamespace(time_budget=budget), Records(), None, Counters(), None, [])
    assert report.eta(0.0, 0) is None  # the first line only starts the measurement
    # 100 records in 10 s: 1,900 records left take 190 s, within the 600 s limit.
    assert report.eta(10.0, 100) == pytest.approx(190.0)
    clock.now += 500.0  # 100 s of the limit left: the stop comes before the end
    assert report.eta(20.0, 200) == pytest.approx(100.0)
    report.budget = None
    assert report.eta(30.0, 300) == pytest.approx(170.0)


# Two epochs of two slices (24 records, batch 4, 3 minibatches a slice), with flips, crops and mixup on:
# its random draws must also come back the same after a resume.
CHAIN = dict(checkpoint_frequency_mb=3, horizontal_flip=True, crop_area_range=[0.8, 1.0], mixup=0.4)
EXPORTS = ["model-resnet_small.e1.keras", "model-resnet_small.e2.keras", "model-resnet_small.keras"]


@pytest.mark.slow
def test_runs_stopped_by_the_limit_end_where_an_uninterrupted_run_does(tmp_path, sample_dataset):
    from deepdanbooru.training.train import train_project

    reference = make_project(tmp_path / "reference", *sample_dataset, **CHAIN)
    train_project(reference, echo=lambda *_: None)

    project = make_project(tmp_path / "chained", *sample_dataset, **CHAIN)
    # A real command: a second has passed before the first slice ends, so it stops after that slice.
    first = run_cli(project, "--time-limit", "1s")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    lines = first.stdout.splitlines()
    assert lines[-1].startswith("Stopped for the time limit after ") and (
        f"at epoch 1/2, record 12/24, step 3: {project / 'checkpoints' / 'ckpt-1'} and model-resnet_small.stopped.keras "
        f"are written. To continue from there, run train-project again, e.g. deepdanbooru train-project {project} "
        "--time-limit 1s") in lines[-1]
    assert f"Exported {project / 'model-resnet_small.stopped.keras'}" in lines
    assert not (project / "model-resnet_small.keras").exists()  # the final export's name waits for the end
    assert not any(line.startswith("Training complete") for line in lines)
    assert (read_state(project)["offset"], read_state(project)["complete"]) == (12, False)

    # In process, with a limit already passed: one slice (the epoch's last, then its export), then the stop.
    second = []
    counters = train_project(project, echo=second.append, time_limit=1e-3)
    assert (counters.used_epoch, counters.offset, counters.used_minibatch) == (1, 0, 6)
    assert second[-1].startswith("Stopped for the time limit") and "at epoch 2/2, record 0/24, step 6" in second[-1]
    assert any("one slice and an export take about" in line for line in second)  # the notice: limit too small
    assert_same_weights(reference / EXPORTS[0], project / EXPORTS[0])
    assert_same_weights(reference / EXPORTS[0], project / "model-resnet_small.stopped.keras")  # the same weights

    train_project(project, echo=lambda *_: None)
    for name in EXPORTS:
        assert_same_weights(reference / name, project / name)
    state, expected = read_state(project), read_state(reference)
    for key in ("used_epoch", "used_minibatch", "used_sample", "offset", "random_seed", "complete"):
        assert state[key] == expected[key]


@pytest.mark.slow
def test_best_model_survives_a_chain_of_time_limit_stops(tmp_path, sample_dataset):
    """Every run trains one slice, then stops; the stop validates a step no slice validated. After the chain,
    best.keras and best.json hold the best validation of logs/history.jsonl."""
    import keras
    import numpy as np

    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "chain", *sample_dataset, checkpoint_frequency_mb=1, epoch_count=1,
                           validation_fraction=0.25, validation_frequency_slices=0, best_model_metric="loss",
                           export_model_per_epoch=0)
    for _ in range(12):
        lines = []
        train_project(project, echo=lines.append, time_limit=1e-3)
        if not lines[-1].startswith("Stopped for the time limit"):
            break
        assert any(line.startswith("Validation at the stop (step ") for line in lines)
        assert not any(line.startswith("Final validation") for line in lines)
        assert not (project / "model-resnet_small.keras").exists()
    assert read_state(project)["complete"]
    validations = [r for r in read_history(project / "logs" / "history.jsonl") if r.get("kind") == "validation"]
    assert len({r["used_minibatch"] for r in validations}) == len(validations) >= 4
    best = min(validations, key=lambda r: r["loss"])
    written = json.loads((project / "model-resnet_small.best.json").read_text())
    assert (written["value"], written["used_minibatch"]) == (pytest.approx(best["loss"]), best["used_minibatch"])
    stopped = keras.models.load_model(project / "model-resnet_small.best.keras")
    assert all(np.isfinite(w).all() for w in stopped.get_weights())
