"""train-project with a validation split: schedule, exports' metric files, best model, history and TensorBoard
across interruptions, records never trained on, and evaluate-project --metrics."""

import json
import shutil

import pytest
from click.testing import CliRunner
from test_monitors import read_scalars
from train_helpers import cli_env, make_project, run_cli, set_config, train_command

from deepdanbooru.cli import main
from deepdanbooru.training.history import read_history
from deepdanbooru.training.monitors import Monitor
from deepdanbooru.training.train import build_monitors, plan_training, train_project

# Whole training runs with validation: the slow tier.
pytestmark = pytest.mark.slow

MODEL = "model-resnet_small"
EXPORTS = [f"{MODEL}.e1", f"{MODEL}.e2", MODEL, f"{MODEL}.best"]
# 24 posts, validation_fraction 0.25 and seed 0 hold out 4: 20 train in slices of 8, 8, 4 records (2, 2, 1 steps),
# so 5 steps an epoch. Every 2nd slice and every epoch end: steps 4 (slice), 5 (epoch), 9 (slice), 10 (epoch).
VALIDATED = {"validation_fraction": 0.25, "validation_frequency_slices": 2}
SCHEDULE = [(4, "slice"), (5, "epoch"), (9, "slice"), (10, "epoch")]
# Fields that depend on the wall clock, not on the weights.
CLOCK = {"time", "seconds", "samples_per_second"}


@pytest.fixture(scope="module")
def validated(tmp_path_factory, sample_dataset):
    """One uninterrupted two-epoch run with validation, shared read-only: (project, console lines)."""
    project = make_project(tmp_path_factory.mktemp("validated") / "project", *sample_dataset, **VALIDATED)
    lines = []
    train_project(project, echo=lines.append)
    return project, lines


def validations(project):
    return [r for r in read_history(project / "logs" / "history.jsonl") if r["kind"] == "validation"]


def without_clock(records):
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in records]


def trained_rows(records):
    """The train and validation lines, without the stop and resume lines a stopped run adds."""
    return [r for r in records if r.get("kind") in ("train", "validation")]


def resumes(records):
    return [(r["used_minibatch"], r["stopped_by"], r["stopped_step"]) for r in records if r["kind"] == "resume"]


def test_validation_schedule_console_and_history(validated):
    project, lines = validated
    assert "Records: 20 training, 4 validation" in lines
    assert any(line.startswith("Validation: 4 records held out (validation_fraction 0.25)") for line in lines)
    checks = validations(project)
    assert [(r["used_minibatch"], r["trigger"]) for r in checks] == SCHEDULE
    assert all(r["samples"] == 4 and r["skipped_images"] == 0 and r["tags"] == 17 for r in checks)
    printed = [line for line in lines if line.startswith("Validation at step ")]
    assert [int(line.split()[3]) for line in printed] == [step for step, _ in SCHEDULE]
    history = read_history(project / "logs" / "history.jsonl")
    assert [(r["kind"], r["used_minibatch"]) for r in history if r["kind"] == "train"] == \
        [("train", step) for step in range(1, 11)]
    assert [r["used_minibatch"] for r in history] == sorted(r["used_minibatch"] for r in history)
    # The end of the run: the summary line, then the final validation a script can grep.
    last = checks[-1]
    assert lines[-2] == "Training complete: 2 epoch(s), 10 steps, 40 samples"
    assert lines[-1] == (f"Final validation (step 10, 4 records): micro-F1 {last['micro_f1']:.4f}, "
                         f"macro-F1 {last['macro_f1']:.4f}, mAP {last['map']:.4f}, loss {last['loss']:.4f}, "
                         f"MCC {last['mcc']:.4f} at threshold 0.5; P=R at {last['pr_threshold']:g} "
                         f"(F1 {last['pr_f1']:.4f}), macro-F1 {last['macro_f1_040']:.4f} and "
                         f"macro-MCC {last['macro_mcc_040']:.4f} at 0.4")


def test_every_export_has_thresholds_and_metrics(validated, sample_dataset):
    project, _ = validated
    _, tags = sample_dataset
    checks = {r["used_minibatch"]: r for r in validations(project)}
    for stem, step in [(f"{MODEL}.e1", 5), (f"{MODEL}.e2", 10), (MODEL, 10)]:
        metrics = json.loads((project / f"{stem}.metrics.json").read_text())
        assert metrics["model"] == f"{stem}.keras" and metrics["used_minibatch"] == step
        assert metrics["epochs_completed"] == step // 5 and metrics["trigger"] == "epoch"
        history = {k: v for k, v in checks[step].items() if k in metrics["metrics"]}
        assert metrics["metrics"] == history
        rows = (project / f"{stem}.thresholds.csv").read_text().splitlines()
        assert rows[0] == "tag,threshold,precision,recall,f1,support,ap,use,reason"
        assert [row.split(",")[0] for row in rows[1:]] == tags
        # No tag has min_support (10) positives among 4 images: every row shares the fallback threshold.
        assert {float(row.split(",")[1]) for row in rows[1:]} == {metrics["metrics"]["fallback_threshold"]}
        assert {row.split(",")[7] for row in rows[1:]} <= {"fallback", "withheld"}
        assert sum(int(row.split(",")[5]) for row in rows[1:]) == metrics["metrics"]["positives"]


def test_best_model_is_the_first_step_with_the_highest_macro_f1(validated):
    project, _ = validated
    checks = validations(project)
    top = max(r["macro_f1"] for r in checks)
    first = next(r for r in checks if r["macro_f1"] == top)
    best = json.loads((project / f"{MODEL}.best.json").read_text())
    assert (best["metric"], best["value"], best["used_minibatch"]) == ("macro_f1", top, first["used_minibatch"])
    assert [r["new_best"] for r in checks] == [
        r["macro_f1"] > max([c["macro_f1"] for c in checks[:i]], default=-1) for i, r in enumerate(checks)]
    assert json.loads((project / f"{MODEL}.best.metrics.json").read_text())["metrics"]["macro_f1"] == top
    assert (project / f"{MODEL}.best.keras").is_file()


def test_tensorboard_holds_training_and_validation_scalars(validated):
    project, _ = validated
    train = read_scalars(project / "logs" / "train")
    assert [step for step, _ in train["loss"]] == list(range(1, 11))
    assert {"loss", "precision", "recall", "f1", "learning_rate", "samples_per_second"} == set(train)
    validation = read_scalars(project / "logs" / "validation")
    checks = validations(project)
    for tag in ("loss", "micro_f1", "macro_f1", "map", "mcc", "global_threshold_f1", "calibrated_macro_f1"):
        assert [step for step, _ in validation[tag]] == [step for step, _ in SCHEDULE]
        assert [value for _, value in validation[tag]] == pytest.approx([r[tag] for r in checks], rel=1e-6)


class Killed(Exception):
    pass


class Killer(Monitor):
    """Raises once at the given event and step, after the monitors before it have recorded that step."""

    def __init__(self, event: str, step: int):
        self.event, self.step = event, step

    def on_step_log(self, log):
        if self.event == "step" and log.progress.used_minibatch == self.step:
            raise Killed

    def on_validation(self, report, logs):
        if self.event == "validation" and report.progress.used_minibatch == self.step:
            raise Killed


def test_interrupted_runs_leave_the_same_history_tensorboard_and_best_model(validated, tmp_path, sample_dataset):
    reference, _ = validated
    project = make_project(tmp_path / "p", *sample_dataset, **VALIDATED)
    # After step 3 (checkpoint at 2), then after the validation at step 9 (before its checkpoint; last one at 7).
    for event, step in [("step", 3), ("validation", 9)]:
        monitors = build_monitors(plan_training(project), echo=lambda *_: None) + [Killer(event, step)]
        with pytest.raises(Killed):
            train_project(project, echo=lambda *_: None, monitors=monitors)
    lines = []
    train_project(project, echo=lines.append)
    assert any(line.startswith("notice: ") and "history.jsonl: dropped 3 line(s)" in line for line in lines)
    assert any(line.startswith("notice: removed ") and "TensorBoard point(s) past step 7" in line for line in lines)
    assert any(line.startswith("Best so far: macro_f1 ") for line in lines)

    history = read_history(project / "logs" / "history.jsonl")
    assert without_clock(trained_rows(history)) == without_clock(read_history(reference / "logs" / "history.jsonl"))
    # Each stop is in the history: killed (no stop line) after step 3 and after the validation at step 9.
    assert resumes(history) == [(2, "killed", 3), (7, "killed", 9)]
    for run in ("train", "validation"):
        resumed, expected = read_scalars(project / "logs" / run), read_scalars(reference / "logs" / run)
        assert set(resumed) == set(expected)
        for tag in set(expected) - CLOCK:
            assert resumed[tag] == expected[tag], tag
    best, expected = (json.loads((p / f"{MODEL}.best.json").read_text()) for p in (project, reference))
    assert without_clock([best]) == without_clock([expected])
    assert lines[-1] == validated[1][-1]  # the same final validation line


@pytest.mark.slow
def test_a_console_line_spanning_a_resume_averages_the_steps_an_uninterrupted_run_s_does(tmp_path, sample_dataset):
    """Lines every 2 steps, checkpoints at steps 2, 4, 5 (the epoch's short last slice), 7...: killed after the
    line of step 6, the run resumes at 5, and its line of step 6 still averages steps 5 and 6."""
    settings = dict(VALIDATED, console_logging_frequency_mb=2)
    reference = make_project(tmp_path / "reference", *sample_dataset, **settings)
    train_project(reference, echo=lambda *_: None)
    project = make_project(tmp_path / "p", *sample_dataset, **settings)
    monitors = build_monitors(plan_training(project), echo=lambda *_: None) + [Killer("step", 6)]
    with pytest.raises(Killed):
        train_project(project, echo=lambda *_: None, monitors=monitors)
    train_project(project, echo=lambda *_: None)
    rows = [without_clock(trained_rows(read_history(p / "logs" / "history.jsonl"))) for p in (project, reference)]
    assert [row["used_minibatch"] for row in rows[1] if row["kind"] == "train"] == [2, 4, 6, 8, 10]
    assert rows[0] == rows[1]


def test_checkpoint_without_monitor_state_resumes_with_the_default_monitors(tmp_path, sample_dataset):
    """A checkpoint saved with other monitors (or before the best-model state existed) still resumes."""
    project = make_project(tmp_path / "p", *sample_dataset, **VALIDATED, epoch_count=1)
    train_project(project, echo=lambda *_: None, monitors=[])
    assert not (project / f"{MODEL}.best.keras").exists()
    set_config(project, epoch_count=2)
    lines = []
    train_project(project, echo=lines.append)
    assert any("used_epoch=1 used_minibatch=5" in line for line in lines)
    assert not any(line.startswith("Best so far") for line in lines)  # nothing was restored for it
    best = json.loads((project / f"{MODEL}.best.json").read_text())
    assert best["used_minibatch"] >= 5 and best["previous"] in (None, *[r["macro_f1"] for r in validations(project)])


def test_validation_records_are_never_trained_on(tmp_path, sample_dataset):
    database, tags = sample_dataset
    shutil.copytree(database.parent, tmp_path / "dataset")
    project = make_project(tmp_path / "p", tmp_path / "dataset" / database.name, tags, **VALIDATED, epoch_count=1)
    held_out = plan_training(project).validation.paths()
    assert len(held_out) == 4
    # Three of the four held-out images become unreadable: training would log (and, past 1%, stop on) any it read.
    for path in held_out[1:]:
        with open(path, "wb") as stream:
            stream.write(b"not an image")
    lines = []
    train_project(project, echo=lines.append)
    log = (project / "logs" / "bad_images.txt").read_text().splitlines()
    assert sorted(line.split("\t")[2] for line in log) == sorted(held_out[1:])
    assert {line.split("\t")[0] for line in log} == {"validation"}
    checks = validations(project)
    assert [(r["samples"], r["skipped_images"]) for r in checks] == [(1, 3)] * 2
    assert any("(1 records, 3 unreadable skipped)" in line for line in lines)


def test_evaluate_project_metrics_match_the_exports(validated):
    project, _ = validated
    runner = CliRunner()

    def metrics_of(*options):
        result = runner.invoke(main, ["evaluate-project", str(project), "--metrics", "--format", "json", *options])
        assert result.exit_code == 0, result.output
        return json.loads(result.output.strip().splitlines()[-1])

    final = metrics_of("--model-path", str(project / f"{MODEL}.keras"))
    assert final["records"] == 4 and final["skipped"] == 0 and final["split"] == "validation"
    # The thresholds derived on the split are those of the file evaluate, the report and export-bundle use.
    tags = len((project / "tags.txt").read_text().split())
    assert {key: final["thresholds"][key] for key in ("file", "same", "tags")} == {
        "file": str(project / f"{MODEL}.thresholds.csv"), "same": tags, "tags": tags}
    assert final["metrics"] == json.loads((project / f"{MODEL}.metrics.json").read_text())["metrics"]
    # The published figures (docs/metrics.md) are in both; no categories.json here, so no per-category ones.
    published = ("pr_threshold", "pr_precision", "pr_recall", "pr_f1", "macro_f1_040", "macro_mcc_040")
    assert all(isinstance(final["metrics"][key], float) for key in published)
    assert 0.0 <= final["metrics"]["pr_threshold"] <= 1.0
    assert not any(key.startswith(("general_", "character_")) for key in final["metrics"])
    best = metrics_of("--model-path", str(project / f"{MODEL}.best.keras"))
    assert best["metrics"] == json.loads((project / f"{MODEL}.best.json").read_text())["metrics"]
    assert (final["model_kind"], best["model_kind"]) == ("the file given with --model-path",
                                                         "the project's best model (--model-path)")
    # Without --model-path: the best export, whose macro-F1 beats the final one's (an earlier step was best).
    assert best["metrics"]["macro_f1"] > final["metrics"]["macro_f1"]
    chosen = metrics_of()
    assert chosen["model"] == str(project / f"{MODEL}.best.keras") and chosen["metrics"] == best["metrics"]
    assert metrics_of("--threshold", "0.3")["metrics"]["threshold"] == 0.3
    ranged = metrics_of("--split", "all", "--start-id", "5", "--end-id", "12")
    assert (ranged["records"], ranged["first_id"], ranged["last_id"], ranged["split"]) == (8, 5, 12, "all")

    text = runner.invoke(main, ["evaluate-project", str(project), "--metrics"])
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[0] == (
        f"Model: {project / MODEL}.best.keras (the project's best model by macro_f1: {best['metrics']['macro_f1']:.4f} "
        f"on validation at step {json.loads((project / f'{MODEL}.best.json').read_text())['used_minibatch']}, better "
        f"than {final['metrics']['macro_f1']:.4f} of {MODEL}.keras, the project's final export; --model-path takes "
        "another)")
    assert text.output.splitlines()[-1].startswith(f"thresholds: {project / MODEL}.best.thresholds.csv, which "
                                                   "evaluate uses: ")
    rows = dict(line.split(None, 1) for line in text.output.splitlines()[2:])
    assert rows["micro_f1"] == f"{chosen['metrics']['micro_f1']:.4f}" and rows["samples"] == "4"
    assert rows["pr_threshold"] == f"{chosen['metrics']['pr_threshold']:.4f}"


@pytest.mark.parametrize("arguments, message", [
    (["--metrics", "image.jpg"], "TARGET is not used with --metrics"),
    ([], "Missing argument 'TARGET'"),
    (["image.jpg", "--split", "all"], "--split can only be used with --metrics"),
    (["--metrics", "--start-id", "9", "--end-id", "3"], "--start-id 9 is greater than --end-id 3"),
    (["--metrics", "--split", "all", "--start-id", "1000"], "posts: no record in the eligible posts with id >= 1000"),
    (["--metrics", "--model-path", "missing.keras"], "missing.keras: model file not found"),
])
def test_evaluate_project_metrics_usage_errors(validated, arguments, message):
    project, _ = validated
    result = CliRunner().invoke(main, ["evaluate-project", str(project), *arguments])
    assert result.exit_code == 2 and message in result.output, result.output


def test_metrics_of_the_validation_split_need_one(tmp_path, sample_dataset):
    project = make_project(tmp_path / "p", *sample_dataset)
    result = CliRunner().invoke(main, ["evaluate-project", str(project), "--metrics"])
    assert result.exit_code == 2
    assert "project.json: validation_fraction: is 0, so the project has no validation split" in result.output


def test_sigkilled_runs_end_with_the_reference_history(validated, tmp_path, sample_dataset):
    """Real kills of the CLI (no monitor gets to clean up), then a full run: same history and best model."""
    import subprocess
    import time

    reference, _ = validated
    project = make_project(tmp_path / "killed", *sample_dataset, **VALIDATED)
    for trigger in ("step 3:", "Validation at step 5", "step 8:"):
        child = subprocess.Popen(train_command(project), env=cli_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        for line in child.stdout:
            if trigger in line:
                time.sleep(0.05)
                child.kill()
                break
        child.wait()
    final = run_cli(project)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    history = read_history(project / "logs" / "history.jsonl")
    assert without_clock(trained_rows(history)) == without_clock(read_history(reference / "logs" / "history.jsonl"))
    assert [reason for _, reason, _ in resumes(history)] == ["killed"] * 3
    for run in ("train", "validation"):
        resumed, expected = read_scalars(project / "logs" / run), read_scalars(reference / "logs" / run)
        for tag in set(expected) - CLOCK:
            assert resumed[tag] == expected[tag], tag
    assert final.stdout.strip().splitlines()[-1].startswith("Final validation (step 10, 4 records): micro-F1 ")
