"""train-project end to end on a tiny project: exports, checkpoints, resume, refusals, safety."""

import json
import shutil
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from train_helpers import (
    assert_same_weights,
    checkpoint_prefixes,
    cli_env,
    make_project,
    read_state,
    run_cli,
    set_config,
    train_command,
)

from deepdanbooru.errors import ModelError, TrainingError
from deepdanbooru.training.monitors import Monitor
from deepdanbooru.training.train import train_project

# Whole training runs (and a kill-and-resume in subprocesses): the slow tier.
pytestmark = pytest.mark.slow

EXPORTS = ["model-resnet_small.e1.keras", "model-resnet_small.e2.keras", "model-resnet_small.keras"]


class Recorder(Monitor):
    """Learning rate in force at each slice end, and every export."""

    def __init__(self):
        self.rates, self.exports = [], []

    def on_slice_end(self, progress, checkpoint, logs):
        self.rates.append((progress.used_epoch, logs["learning_rate"]))

    def on_export(self, path, kind):
        self.exports.append((path.name, kind))


def read_config_database(project):
    import json

    return json.loads((project / "project.json").read_text())["database_path"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, sample_dataset):
    """One uninterrupted two-epoch run, shared read-only: (project, console lines)."""
    project = make_project(tmp_path_factory.mktemp("trained") / "project", *sample_dataset)
    lines = []
    train_project(project, echo=lines.append)
    return project, lines


def test_two_epochs_write_exports_and_at_most_three_checkpoints(trained):
    project, lines = trained
    assert sorted(p.name for p in project.glob("*.keras")) == sorted(EXPORTS)
    assert not list(project.glob(".*.keras"))  # no partial export left behind
    # 3 slices x 2 epochs were written; the latest 3 are kept.
    assert checkpoint_prefixes(project) == ["ckpt-4", "ckpt-5", "ckpt-6"]
    state = read_state(project)
    assert state["checkpoint"] == "ckpt-6" and state["complete"] is True
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.scoring.split import records_hash

    # What a resume compares to keep a started run's split (scoring.split.split_for_run).
    assert state["records_hash"] == records_hash(load_records(read_config_database(project), 1))
    # 24 records, batch 4: 6 steps an epoch (slices of 8, 8, 8 records = 2 full batches each).
    assert (state["used_epoch"], state["used_minibatch"], state["used_sample"], state["offset"],
            state["random_seed"]) == (2, 12, 48, 0, 2)
    assert not (project / ".train.lock").exists()
    assert "Starting fresh (no checkpoint)" in lines
    assert "Records: 24 training, 0 validation" in lines
    progress = [line for line in lines if line.startswith("epoch ")]
    assert len(progress) == 12  # console_logging_frequency_mb 1
    assert all("loss" in line and "precision" in line and "recall" in line and "f1" in line
               and "samples/s" in line and "%" in line and "ETA" in line for line in progress)
    assert progress[-1].startswith("epoch 2/2 step 12:") and " 100.0% " in progress[-1]
    assert lines[-1] == "Training complete: 2 epoch(s), 12 steps, 48 samples"


def test_export_opens_with_plain_keras_and_holds_no_optimizer(trained):
    project, _ = trained
    export = project / "model-resnet_small.keras"
    with zipfile.ZipFile(export) as archive:
        names = archive.namelist()
        assert "model.weights.h5" in names
        config = json.loads(archive.read("config.json"))
    assert not config.get("compile_config")
    # A process that never imports deepdanbooru: only built-in Keras layers, no optimizer variables.
    script = textwrap.dedent(f"""
        import io, sys, zipfile, h5py, keras, numpy as np
        model = keras.models.load_model({str(export)!r})
        assert "deepdanbooru" not in sys.modules
        weights = io.BytesIO(zipfile.ZipFile({str(export)!r}).read("model.weights.h5"))
        with h5py.File(weights, "r") as f:
            groups = []
            f.visit(groups.append)
        assert not [g for g in groups if "optimizer" in g], [g for g in groups if "optimizer" in g]
        scores = model.predict(np.zeros((1, 32, 32, 3), np.float32), verbose=0)
        print(model.input_shape, scores.shape, float(scores.min()), float(scores.max()))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=dict(cli_env(), PYTHONPATH=""))
    assert result.returncode == 0, result.stderr[-2000:]
    shapes = result.stdout.strip().splitlines()[-1]
    assert shapes.startswith("(None, 32, 32, 3) (1, 17)")


def test_fresh_run_reproducible_and_resume_at_an_epoch_boundary(trained, tmp_path, sample_dataset):
    """A fresh run repeats the reference bit for bit; stopping after epoch 1 and raising epoch_count
    continues exactly; running a finished project again trains nothing."""
    reference, _ = trained
    project = make_project(tmp_path / "split", *sample_dataset, epoch_count=1)
    train_project(project, echo=lambda *_: None)
    assert_same_weights(reference / "model-resnet_small.e1.keras", project / "model-resnet_small.e1.keras")
    set_config(project, epoch_count=2)
    lines = []
    train_project(project, echo=lines.append)
    # The last checkpoint is the last slice's: epoch 1's end runs again (re-export), then epoch 2.
    assert any(line.startswith("Resuming from ") and "used_epoch=1 used_minibatch=6 used_sample=24 offset=0 "
               "random_seed=1 (1 of 2 epoch(s) done)" in line for line in lines)
    for name in EXPORTS:
        assert_same_weights(reference / name, project / name)
    before = {p.name: p.stat().st_mtime_ns for p in (project / "checkpoints").glob("ckpt-*")}
    lines = []
    train_project(project, echo=lines.append)
    assert any("Training already complete (2 of 2 epochs)" in line for line in lines)
    assert not any(line.startswith(("epoch ", "Checkpoint")) for line in lines)
    assert {p.name: p.stat().st_mtime_ns for p in (project / "checkpoints").glob("ckpt-*")} == before
    for name in EXPORTS:
        assert_same_weights(reference / name, project / name)
    # epoch_count lowered below the epochs trained: they are said, and counted, as they are.
    set_config(project, epoch_count=1)
    lines = []
    counters = train_project(project, echo=lines.append)
    assert (f"Training already complete: 2 epochs trained, more than epoch_count 1 in {project / 'project.json'}; "
            "writing the exports of those weights again (a shorter run needs a new project)") in lines
    assert (counters.used_epoch, counters.offset) == (2, 0) and lines[-1].startswith("Training complete: 2 epoch(s)")
    assert (read_state(project)["used_epoch"], read_state(project)["complete"]) == (2, True)
    assert_same_weights(reference / "model-resnet_small.keras", project / "model-resnet_small.keras")


def copy_at(reference, directory, checkpoint: str):
    """A copy of the reference project whose latest checkpoint is `checkpoint` (an earlier state of the run)."""
    shutil.copytree(reference, directory)
    (directory / "checkpoints" / "checkpoint").write_text(
        f'model_checkpoint_path: "{checkpoint}"\nall_model_checkpoint_paths: "{checkpoint}"\n')
    return directory


def _kill_when(project, trigger: str, occurrence: int, delay: float) -> str:
    """Start a real train-project, SIGKILL it `delay` s after the `occurrence`-th line containing `trigger`."""
    import time

    child = subprocess.Popen(train_command(project), env=cli_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = 0
    output = []
    for line in child.stdout:
        output.append(line)
        if trigger in line:
            seen += 1
            if seen == occurrence:
                time.sleep(delay)
                child.kill()
                break
    child.wait()
    return "".join(output)


def test_sigkill_at_varied_moments_then_resume_matches(trained, tmp_path, sample_dataset):
    reference, _ = trained
    project = make_project(tmp_path / "killed", *sample_dataset)
    # Just after a checkpoint (while the next slice starts), around the epoch-1 export, mid-step in epoch 2.
    kills = [("Checkpoint", 1, 0.02), ("Exported", 1, 0.05), ("step 9:", 1, 0.0)]
    outputs = [_kill_when(project, *kill) for kill in kills]
    assert not any("Training complete" in out for out in outputs)  # every kill landed before the end
    assert all("Resuming from" in out for out in outputs[1:])
    final = run_cli(project)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-2000:]
    for name in EXPORTS:
        assert_same_weights(reference / name, project / name)
    state, expected = read_state(project), read_state(reference)
    for key in ("used_epoch", "used_minibatch", "used_sample", "offset", "random_seed", "complete"):
        assert state[key] == expected[key]
    assert len(checkpoint_prefixes(project)) <= 3
    assert not list(project.glob(".*.keras")) and not (project / ".train.lock").exists()


def test_half_written_checkpoint_and_export_are_ignored(trained, tmp_path):
    """What a kill during a save leaves behind (files TensorFlow had not yet published, a partial export,
    a stale lock) does not disturb the resume from the mid-epoch checkpoint before it."""
    reference, _ = trained
    project = copy_at(reference, tmp_path / "half", "ckpt-5")  # epoch 2, offset 16 of 24
    for name in EXPORTS[1:]:
        (project / name).unlink()
    checkpoints = project / "checkpoints"
    for stale in checkpoints.glob("ckpt-6.*"):
        stale.unlink()
    (checkpoints / "ckpt-6_temp").mkdir()
    (checkpoints / "ckpt-6_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 100)
    (checkpoints / "ckpt-6.data-00000-of-00001").write_bytes(b"\1" * 10)
    (checkpoints / "ckpt-9_temp").mkdir()  # of a number this run never saves again: only the start removes it
    (checkpoints / "ckpt-9_temp" / "part-00000-of-00001.index.tempstate123").write_bytes(b"\0")
    (project / ".model-resnet_small.e2.partial-99999").mkdir()
    (project / ".model-resnet_small.e2.partial-99999" / "model-resnet_small.e2.keras").write_bytes(b"PK half")
    (project / ".train.lock").write_text(json.dumps({"pid": _dead_pid(), "hostname": socket.gethostname(),
                                                      "started": 1.0}))
    lines = []
    train_project(project, echo=lines.append)
    assert any("took over the stale training lock" in line for line in lines)
    assert any("used_epoch=1 used_minibatch=10 used_sample=40 offset=16 random_seed=1" in line for line in lines)
    assert not list(project.glob(".*partial*")) and not list(checkpoints.glob("*_temp"))
    for name in EXPORTS:
        assert_same_weights(reference / name, project / name)
    assert read_state(project)["checkpoint"] == "ckpt-6"


def test_records_cut_below_the_saved_offset_finish_the_epoch_and_say_so(trained, tmp_path):
    import sqlite3

    reference, _ = trained
    project = copy_at(reference, tmp_path / "fewer", "ckpt-5")  # epoch 2, offset 16 of 24
    database = Path(json.loads((project / "project.json").read_text())["database_path"])
    copy = tmp_path / "data"
    shutil.copytree(database.parent, copy)
    with sqlite3.connect(copy / database.name) as connection:
        connection.execute("DELETE FROM posts WHERE id > 12")  # 12 records left
    set_config(project, database_path=str(copy / database.name))
    lines = []
    train_project(project, echo=lines.append)
    notices = [line for line in lines if line.startswith("notice: the training records changed")]
    assert len(notices) == 1 and "had reached offset 16, past the 12 records an epoch now holds, so it counts as " \
                                  "finished and the next one starts" in notices[0]


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("change, message", [
    ("tags", "tags.txt: content changed"),
    ("model", "model was 'resnet_small', now 'resnet_custom_v4'"),
    ("size", "was 32x32, now 64x32"),
    ("optimizer", r"the optimizer's saved state does not fit \(.*\): .*project.json's optimizer \(or a setting"),
])
def test_resume_with_changed_setup_is_refused(trained, tmp_path, change, message):
    source, _ = trained
    project = tmp_path / "project"
    shutil.copytree(source, project)
    if change == "tags":
        tags = (project / "tags.txt").read_text().split()
        (project / "tags.txt").write_text("\n".join(reversed(tags)) + "\n")
    elif change == "model":
        set_config(project, model="resnet_custom_v4")
    elif change == "optimizer":
        set_config(project, optimizer="sgd")
    else:
        set_config(project, image_height=64)
    before = {p.name: p.stat().st_mtime_ns for p in (project / "checkpoints").iterdir()}
    with pytest.raises(TrainingError, match=message) as error:
        train_project(project, echo=lambda *_: None)
    assert "delete" in str(error.value) and "start fresh" in str(error.value)
    assert {p.name: p.stat().st_mtime_ns for p in (project / "checkpoints").iterdir()} == before
    assert not (project / ".train.lock").exists()


def test_learning_rate_schedule_and_non_finite_loss(trained, tmp_path):
    reference, _ = trained
    project = tmp_path / "p"
    shutil.copytree(reference, project)
    # Epoch 3 at its scheduled rate; epoch 4 at an absurd one, so the loss overflows.
    set_config(project, epoch_count=4, learning_rates=[{"used_epoch": 2, "learning_rate": 0.003},
                                                       {"used_epoch": 3, "learning_rate": 1e30}])
    recorder = Recorder()
    with pytest.raises(TrainingError, match=r"non-finite loss at step (\d+) \(epoch 4\)") as error:
        train_project(project, echo=lambda *_: None, monitors=[recorder])
    assert recorder.rates == [(2, pytest.approx(0.003))] * 3
    # The copied run's last checkpoint is epoch 2's last slice, so epoch 2's end (its export) runs again.
    assert recorder.exports == [("model-resnet_small.e2.keras", "epoch"), ("model-resnet_small.e3.keras", "epoch")]
    message = str(error.value)
    step = int(message.split("non-finite loss at step ")[1].split()[0])
    assert step > 18  # epoch 4 starts after step 18
    assert "project.json: learning_rate:" in message and "1e+30" in message
    # No checkpoint after the bad step: the latest is still a finite state from before it.
    state = read_state(project)
    assert state["used_minibatch"] < step
    latest = (project / "checkpoints" / "checkpoint").read_text().split('"')[1]
    assert state["checkpoint"] == latest
    assert (project / "checkpoints" / f"{latest}.index").exists()


def test_no_eligible_records(tmp_path, sample_dataset):
    project = make_project(tmp_path / "p", *sample_dataset, minimum_tag_count=1000)
    with pytest.raises(TrainingError, match=r"posts: no eligible records .*tag_count_general >= 1000"):
        train_project(project, echo=lambda *_: None)
    assert not (project / "checkpoints").exists() and not list(project.glob("*.keras"))


def _copy_dataset(sample_dataset, directory):
    database, tags = sample_dataset
    shutil.copytree(database.parent, directory)
    return directory / database.name, tags


def test_all_images_bad(tmp_path, sample_dataset):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    for image in (database.parent / "images").rglob("*.jpg"):
        image.write_bytes(b"not an image")
    project = make_project(tmp_path / "p", database, tags)
    with pytest.raises(TrainingError, match=r"no usable batch in records 0\.\.7 of epoch 1: all 8 images"):
        train_project(project, echo=lambda *_: None)
    assert not list(project.glob("*.keras")) and not (project / "checkpoints").exists()
    assert len((project / "logs" / "bad_images.txt").read_text().splitlines()) == 8


def test_bad_fraction_over_the_limit(tmp_path, sample_dataset):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    corrupt = next((database.parent / "images").rglob("*.jpg"))
    corrupt.write_bytes(b"\xff\xd8\xff truncated")
    project = make_project(tmp_path / "p", database, tags, max_bad_image_fraction=0.01)
    with pytest.raises(TrainingError, match=r"1 of \d+ images in epoch 1 failed to load, more than "
                                            r"max_bad_image_fraction 0.01"):
        train_project(project, echo=lambda *_: None)
    # With a tolerant limit the same data trains, and the bad image is named in the log and on the console.
    set_config(project, max_bad_image_fraction=0.1, epoch_count=1)
    lines = []
    train_project(project, echo=lines.append)
    state = read_state(project)
    assert state["used_sample"] == 23 and state["used_minibatch"] == 6
    log = (project / "logs" / "bad_images.txt").read_text().splitlines()
    assert log and all("truncated: jpeg of 13 bytes ends early" in line for line in log)
    warnings = [line for line in lines if line.startswith("warning: 1 picture of records")]
    assert len(warnings) == 1, lines
    assert warnings[0].endswith(f"in epoch 1 could not be read and was skipped: {corrupt} (truncated); "
                                f"{project / 'logs' / 'bad_images.txt'} lists it with the reasons")


def test_live_lock_refuses_a_second_run(tmp_path, sample_dataset):
    project = make_project(tmp_path / "p", *sample_dataset)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = project / ".train.lock"
        lock.write_text(json.dumps({"pid": sleeper.pid, "hostname": socket.gethostname(), "started": 1.0}))
        result = run_cli(project)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1].startswith(f"error: {lock}: another train-project holds")
        assert json.loads(lock.read_text())["pid"] == sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()


def test_source_model_must_match_input_and_tags(tmp_path, sample_dataset):
    from deepdanbooru.models import build_model

    wrong = tmp_path / "wrong.keras"
    build_model("resnet_small", (32, 32, 3), 5).save(wrong)
    project = make_project(tmp_path / "p", *sample_dataset)
    with pytest.raises(ModelError, match=r"wrong.keras: output: model output is \(5,\), but .*tags.txt has 17"):
        train_project(project, source_model=wrong, echo=lambda *_: None)
    wrong_input = tmp_path / "input.keras"
    build_model("resnet_small", (48, 32, 3), 17).save(wrong_input)
    with pytest.raises(ModelError, match=r"input.keras: input: model input is \(48, 32, 3\)"):
        train_project(project, source_model=wrong_input, echo=lambda *_: None)
    with pytest.raises(ModelError, match=r"missing.keras: --source-model not found \(give a .keras/.h5 file or a timm checkpoint folder\)"):
        train_project(project, source_model=tmp_path / "missing.keras", echo=lambda *_: None)


def test_compiled_run_matches_and_resumes_exactly(trained, tmp_path, sample_dataset):
    """jit_compile: resnet_small (its stem's MaxPooling2D included) trains under XLA without a fallback, ends
    within float rounding of the uncompiled run, and a run resumed from a mid-epoch checkpoint (as a kill
    right after it leaves the project) ends bit for bit where the unbroken compiled run did."""
    import numpy as np

    from train_helpers import weights

    reference, _ = trained
    project = make_project(tmp_path / "compiled", *sample_dataset, jit_compile=True, epoch_count=1)
    lines = []
    train_project(project, echo=lines.append)
    assert not any("jit_compile" in line for line in lines)
    # Adam's early steps move each weight by about the learning rate (0.001) whatever the gradient's size,
    # so XLA's other rounding of near-zero gradients shows as differences of a few steps, not more.
    for compiled, plain in zip(weights(project / EXPORTS[0]), weights(reference / EXPORTS[0])):
        np.testing.assert_allclose(compiled, plain, rtol=1e-2, atol=5e-3)
    resumed = copy_at(project, tmp_path / "resumed", "ckpt-1")
    for name in EXPORTS[:1] + EXPORTS[2:]:
        (resumed / name).unlink()
    lines = []
    train_project(resumed, echo=lines.append)
    assert any(line.startswith("Resuming from ") for line in lines)
    for name in EXPORTS[:1] + EXPORTS[2:]:
        assert_same_weights(project / name, resumed / name)
