"""What a first-time user meets in a training run: trust warnings, the interrupt message, one
reading of the resume counters, file modes, the TensorBoard command.

One tiny project is trained once: interrupted by Ctrl-C right after the last checkpoint of epoch 1 (the
point that reads as used_epoch 0 / offset = train records), checked by preflight, then resumed to the end.
"""

import json
import os
import stat
import tomllib

import pytest
from click.testing import CliRunner
from train_helpers import ROOT, make_project

from deepdanbooru.cli import main
from deepdanbooru.dataset.trust import SplitStats, split_stats, trust_warning
from deepdanbooru.preflight.main import training_preflight
from deepdanbooru.training import train as train_module
from deepdanbooru.training.monitors import Eta, Monitor

UMASK = 0o002  # not the usual 022, so a hard-coded 0644 shows as well as mkstemp's 0600


class CtrlC(Monitor):
    """Raises KeyboardInterrupt after the checkpoint of epoch 1's last slice, as a Ctrl-C there would."""

    def on_slice_end(self, progress, checkpoint, logs):
        if progress.used_epoch == 0 and progress.offset >= progress.train_records:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def run(tmp_path_factory, sample_dataset):
    """One epoch, interrupted after its last checkpoint; the resumed run has only the epoch end and exports left."""
    project = tmp_path_factory.mktemp("first_use") / "project"
    original_umask = os.umask(UMASK)
    original_build = train_module.build_monitors
    try:
        assert CliRunner().invoke(main, ["create-project", str(project)]).exit_code == 0
        make_project(project, *sample_dataset, validation_fraction=0.25, epoch_count=1)  # same files, same modes
        train_module.build_monitors = lambda plan, echo: [*original_build(plan, echo), CtrlC()]
        interrupted = CliRunner().invoke(main, ["train-project", str(project)])
        train_module.build_monitors = original_build
        preflight = {r.name: r for r in training_preflight(project)}
        resumed = CliRunner().invoke(main, ["train-project", str(project)])
    finally:
        train_module.build_monitors = original_build
        os.umask(original_umask)
    return project, interrupted, preflight, resumed


def _line(output: str, start: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(start))


@pytest.mark.slow
def test_ctrl_c_says_where_the_run_stands_and_exits_130(run):
    project, interrupted, _, _ = run
    assert interrupted.exit_code == 130, interrupted.output
    line = _line(interrupted.output, "interrupted: ")
    checkpoint = project / "checkpoints" / "ckpt-3"
    assert line.startswith("interrupted: stopped in epoch 1 of 1 at record ")
    assert f"the last checkpoint {checkpoint} holds used_epoch=1 " in line
    assert "offset=0 random_seed=1 (1 of 1 epoch(s) done); running the same command resumes from it" in line


@pytest.mark.slow
def test_preflight_and_train_project_print_the_same_counters(run):
    project, interrupted, preflight, resumed = run
    counters = _line(interrupted.output, "interrupted: ").split(" holds ")[1].split("; running")[0]
    assert preflight["checkpoint"].detail == (
        f"the next train-project will RESUME from {project / 'checkpoints' / 'ckpt-3'}: {counters}; all 1 "
        "epoch(s) are trained, so it only exports the final model again (raise epoch_count to train on)")
    assert _line(resumed.output, "Resuming from ") == (
        f"Resuming from {project / 'checkpoints' / 'ckpt-3'}: {counters}")


@pytest.mark.slow
def test_best_json_counts_the_validated_epoch_as_done(run):
    project, _, _, resumed = run
    assert resumed.exit_code == 0, resumed.output
    best = json.loads((project / "model-resnet_small.best.json").read_text())
    state = json.loads((project / "checkpoints" / "state.json").read_text())
    assert (best["used_epoch"], best["offset"], best["epochs_completed"]) == (1, 0, 1)
    final = json.loads((project / "model-resnet_small.metrics.json").read_text())
    assert (final["used_epoch"], final["offset"]) == (state["used_epoch"], state["offset"]) == (1, 0)


@pytest.mark.slow
def test_untrustworthy_split_is_announced_in_preflight_and_at_start_and_end(run):
    _, interrupted, preflight, resumed = run
    assert preflight["split"].status == "WARN"
    warning = preflight["split"].detail.split("; ", 1)[1]
    assert warning.startswith("results cannot be trusted: the validation split is too small to measure the "
                              "model: ")
    assert "(at least 50 needed)" in warning and "raise validation_fraction in" in warning
    assert "(now 0.25)" in warning
    lines = resumed.output.splitlines()
    assert lines[0] == f"warning: {warning}"  # at start, before anything else
    # And at the end, just above the final figures (the final validation line stays the last one).
    assert lines[-3] == f"warning: {warning}"
    assert lines[-2].startswith("Training complete") and lines[-1].startswith("Final validation")
    assert f"warning: {warning}" in interrupted.output
    assert resumed.exit_code == 0


@pytest.mark.slow
def test_every_file_of_a_trained_project_has_the_mode_open_gives(run):
    project, *_ = run
    expected = 0o666 & ~UMASK
    files = [path for path in project.rglob("*") if path.is_file()]
    names = {path.name for path in files}
    for name in ("project.json", "model-resnet_small.keras", "model-resnet_small.thresholds.csv",
                 "model-resnet_small.metrics.json", "model-resnet_small.best.json", "state.json",
                 "history.jsonl"):
        assert name in names
    wrong = {str(path.relative_to(project)): oct(stat.S_IMODE(path.stat().st_mode)) for path in files
             if stat.S_IMODE(path.stat().st_mode) != expected}
    assert not wrong, f"expected {oct(expected)}"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_renamed_into_place_get_the_mode_open_gives(tmp_path, umask):
    from deepdanbooru.dataset.build import make_training_database
    from deepdanbooru.fileio import write_text_atomic
    from deepdanbooru.sample.generator import generate_sample_dataset

    original = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "a.json", "{}")
        database, _ = generate_sample_dataset(tmp_path / "sample", count=4, size=16)
        make_training_database(database, tmp_path / "train.sqlite", echo=lambda *_: None,
                               progress=lambda *_: None)
    finally:
        os.umask(original)
    for path in (tmp_path / "a.json", database, tmp_path / "train.sqlite"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


@pytest.mark.slow
def test_train_project_prints_the_tensorboard_command(run):
    project, _, _, resumed = run
    assert f"TensorBoard: tensorboard --logdir {project / 'logs'}" in resumed.output


def test_tensorboard_is_an_optional_extra_outside_test():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("tensorboard") for requirement in extras["tensorboard"])
    assert not any(requirement.startswith("tensorboard") for requirement in extras["test"])
    for readme in (ROOT / "README.md", ROOT / "sample-project" / "README.md"):
        assert '.[tensorboard]' in readme.read_text()


def test_trust_warning_thresholds():
    tags = ["a", "b", "c", "d"]
    rows = [(False, "a b c d")] * 10 + [(True, "a b c d")] * 60
    assert trust_warning(split_stats(rows, tags), 0.1, "p.json") is None
    assert trust_warning(split_stats(rows, tags), 0.0, "p.json") is None  # validation off: nothing to measure
    few = trust_warning(split_stats(rows[:10] + rows[10:13], tags), 0.1, "p.json")
    assert few.startswith("results cannot be trusted: the validation split is too small to measure the model: "
                          "3 posts (at least 50 needed)")
    assert "raise validation_fraction in p.json (now 0.1)" in few
    # Enough posts, but 3 of 4 tags never positive among them.
    empty = trust_warning(split_stats(rows[:10] + [(True, "a")] * 60, tags), 0.1, "p.json")
    assert "60 posts, 3 of 4 tags without a positive example in it" in empty
    rare = trust_warning(SplitStats(train_posts=27, validation_posts=100, tags=4, tags_without_validation_positive=0,
                                    rare_training_tags=2), 0.1, "p.json")
    assert rare == ("results cannot be trusted: 2 tags of 4 have fewer than 5 positive examples among the 27 "
                    "training posts and cannot be learnt; add posts or drop rare tags from tags.txt "
                    "(make-tags --minimum-post-count)")


def test_eta_leaves_out_the_warm_up():
    eta = Eta(total_records=1000)
    # The first line comes after 100 s of tracing and compilation for 10 records: it only starts the clock.
    assert eta.update(now=100.0, done=10) is None
    assert eta.update(now=100.0, done=10) is None
    # Then 90 records in 9 s: 10 records/s, 900 left.
    assert eta.update(now=109.0, done=100) == pytest.approx(90.0)
    # A resumed run starts its clock where it resumed (done = 500 at the first line), not at 0.
    resumed = Eta(total_records=1000)
    assert resumed.update(now=50.0, done=500) is None
    assert resumed.update(now=60.0, done=600) == pytest.approx(40.0)
