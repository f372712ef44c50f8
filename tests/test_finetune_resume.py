"""Resuming a --source-model run: the checkpoint records the source and its network, so every command a
stopped run prints works as printed, and every place names the network that trains with one name and count.

The source is the WD-like ViT fixture (a timm checkpoint folder whose config.json says vit_base_patch16_224
with model_args of 2 blocks, 32 wide: the network is named with both); project.json names vit_small_patch16, which
is not what trains: the
exports carry the network's name, except in a run resumed from a checkpoint written before checkpoints
recorded it, which keeps the name its exports already have.
"""

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from train_helpers import assert_same_weights, cli_env, make_project, read_state, run_cli

from deepdanbooru.cli import main
from deepdanbooru.preflight.main import training_preflight
from deepdanbooru.training import train as train_module
from deepdanbooru.training.monitors import Monitor

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "timm" / "vit_wd"
# The fixture's architecture with the arguments that size it: the name of the network it builds.
NETWORK = "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32"
# One epoch of two slices (24 records, batch 4, 3 minibatches a slice).
SETUP = dict(model="vit_small_patch16", epoch_count=1, checkpoint_frequency_mb=3)
STOPPED, FINAL = f"model-{NETWORK}.stopped.keras", f"model-{NETWORK}.keras"
OLD_FINAL = "model-vit_small_patch16.keras"  # as a run started before the exports took the network's name


class CtrlC(Monitor):
    """Raises KeyboardInterrupt after the first checkpoint, as a Ctrl-C there would."""

    def on_slice_end(self, progress, checkpoint, logs):
        raise KeyboardInterrupt


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return Path(shutil.copytree(FIXTURE, tmp_path_factory.mktemp("source") / "wd-tagger"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sample_dataset, folder):
    """The same run, never stopped."""
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path_factory.mktemp("reference") / "p", *sample_dataset, **SETUP)
    train_project(project, source_model=folder, echo=lambda *_: None)
    return project


def _model_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("Model: "))


def _printed_command(line: str) -> list[str]:
    """The command a time-limit stop prints, as the shell would split it, `deepdanbooru` run from this tree."""
    command = shlex.split(line.split(", e.g. ", 1)[1])
    assert command[0] == "deepdanbooru"
    return [sys.executable, "-m", "deepdanbooru", *command[1:]]


@pytest.mark.slow
def test_the_command_a_time_limit_stop_prints_continues_the_source_models_run(tmp_path, sample_dataset, folder,
                                                                               reference):
    import subprocess

    import keras

    from deepdanbooru.models.builder import count_weights

    project = make_project(tmp_path / "p", *sample_dataset, **SETUP)
    first = run_cli(project, "--source-model", str(folder), "--time-limit", "1s")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    stop = first.stdout.splitlines()[-1]
    assert stop.startswith("Stopped for the time limit") and read_state(project)["offset"] == 12
    command = _printed_command(stop)
    assert "--source-model" not in command

    # One name and one count for the network that trains: the run, state.json, preflight and the export.
    export = keras.models.load_model(project / STOPPED)
    trainable, non_trainable = count_weights(export)
    counts = f"{trainable:,} trainable and {non_trainable:,} non-trainable parameters"
    assert export.name == NETWORK
    assert _model_line(first.stdout) == f"Model: {NETWORK} (from {folder}), input 32x32, batch 4, float32; {counts}"
    state = read_state(project)
    assert (state["network"], state["source"]) == (NETWORK, str(folder))
    assert state["parameters"] == {"trainable": trainable, "non_trainable": non_trainable}
    checks = {result.name: result for result in training_preflight(project)}
    assert checks["model"].status == "PASS"
    assert checks["model"].detail == (
        f"{NETWORK} (fine-tuned from --source-model {folder}, as the checkpoint records it, exported as {FINAL}; "
        f"the source's network trains, not one built from project.json's model vit_small_patch16): input 32x32x3, "
        f"{counts}")
    assert checks["checkpoint"].status == "PASS"
    assert checks["checkpoint"].detail.startswith(
        f"the next train-project will RESUME from {project / 'checkpoints' / 'ckpt-1'} (the network {NETWORK} "
        f"fine-tuned from --source-model {folder}, rebuilt from the checkpoint: --source-model may be left out")

    # As printed: no --source-model, and the source's files need not be there any more.
    moved = folder.with_name("moved-away")
    folder.rename(moved)
    try:
        resumed = subprocess.run(command, env=cli_env(), capture_output=True, text=True)
    finally:
        moved.rename(folder)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    lines = resumed.stdout.splitlines()
    assert f"Resuming from {project / 'checkpoints' / 'ckpt-1'}: " in "\n".join(lines)
    assert (f"Network: {NETWORK}, fine-tuned from --source-model {folder}: rebuilt from the checkpoint (the "
            "source's files are not read again)") in lines
    assert _model_line(resumed.stdout) == _model_line(first.stdout)
    assert any(line.startswith("Training complete") for line in lines)
    assert read_state(project)["complete"] and read_state(project)["used_epoch"] == 1
    # Exactly where the uninterrupted run ends.
    assert_same_weights(reference / FINAL, project / FINAL)
    final = keras.models.load_model(project / FINAL)
    assert final.name == NETWORK and count_weights(final) == (trainable, non_trainable)


@pytest.mark.slow
def test_ctrl_c_then_the_same_command_resumes_and_another_source_is_refused(tmp_path, sample_dataset, folder,
                                                                             reference, monkeypatch):
    project = make_project(tmp_path / "p", *sample_dataset, **SETUP)
    original = train_module.build_monitors
    monkeypatch.setattr(train_module, "build_monitors", lambda plan, echo: [*original(plan, echo), CtrlC()])
    same = ["train-project", str(project), "--source-model", str(folder)]
    interrupted = CliRunner().invoke(main, same)
    assert interrupted.exit_code == 130, interrupted.output
    assert interrupted.output.splitlines()[-1].endswith("running the same command resumes from it")
    monkeypatch.setattr(train_module, "build_monitors", original)

    # Another source (the same files elsewhere count as another: the checkpoint names its path) is one line.
    other = Path(shutil.copytree(folder, tmp_path / "other-tagger"))
    before = {path: path.stat().st_mtime_ns for path in (project / "checkpoints").iterdir()}
    refused = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(other)])
    assert refused.exit_code == 2, refused.output
    assert refused.output.splitlines() == [
        f"error: {project / 'checkpoints'}: the checkpoint was fine-tuned from --source-model {folder}, not "
        f"{other}; leave --source-model out (or give that one) to resume, or delete {project / 'checkpoints'} to "
        "start fresh from another"]
    assert {path: path.stat().st_mtime_ns for path in (project / "checkpoints").iterdir()} == before

    resumed = CliRunner().invoke(main, same)  # the same command, as the interrupt message says
    assert resumed.exit_code == 0, resumed.output
    assert f"Resuming from {project / 'checkpoints' / 'ckpt-1'}: " in resumed.output
    assert re.search(rf"^Model: {NETWORK} \(from {re.escape(str(folder))}\), ", resumed.output, re.M)
    assert_same_weights(reference / FINAL, project / FINAL)


def test_preflight_reads_no_network_from_a_state_json_without_one(tmp_path):
    from deepdanbooru.project.resume import fine_tuned_network

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    state = {"version": 1, "checkpoint": "ckpt-1", "model": "resnet_small"}
    (checkpoints / "state.json").write_text(json.dumps(state))
    (checkpoints / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert fine_tuned_network(checkpoints) is None  # written before the record, or without a source
    recorded = {"network": NETWORK, "source": "/x/wd", "parameters": {"trainable": 5, "non_trainable": 1}}
    (checkpoints / "state.json").write_text(json.dumps({**state, **recorded}))
    assert fine_tuned_network(checkpoints) == recorded
    (checkpoints / "checkpoint").unlink()  # no checkpoint to resume: the next run starts fresh
    assert fine_tuned_network(checkpoints) is None


@pytest.mark.slow
def test_a_checkpoint_written_before_the_record_resumes_with_its_source_model(tmp_path, sample_dataset, folder,
                                                                              reference, monkeypatch):
    import tensorflow as tf

    from deepdanbooru.training import checkpointing
    from deepdanbooru.training.network import Network
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, **SETUP)
    # As written before checkpoints recorded the network: no such variables, no such state.json keys.
    with monkeypatch.context() as old:
        old.setattr(checkpointing, "NetworkState", lambda network: tf.Module(name="network"))
        old.setattr(Network, "mirror", lambda self: {})
        train_project(project, source_model=folder, echo=lambda *_: None, time_limit=1e-3)
    assert "network" not in read_state(project) and read_state(project)["offset"] == 12

    lines = []
    train_project(project, source_model=folder, echo=lines.append)
    assert f"Resuming from {project / 'checkpoints' / 'ckpt-1'}: " in "\n".join(lines)
    assert read_state(project)["source"] == str(folder)  # recorded from now on
    # Its exports keep the name they started under, and the tools find them by it.
    assert read_state(project)["exports"] == "vit_small_patch16" and not (project / FINAL).exists()
    assert_same_weights(reference / FINAL, project / OLD_FINAL)
    from deepdanbooru.inference.model_files import resolve_model_files

    assert resolve_model_files(project_path=project).model == project / OLD_FINAL


def test_preflight_and_the_report_name_the_network_that_trains_and_its_size(reference, folder, tmp_path,
                                                                            sample_dataset):
    """Before training (preflight told the --source-model) and after it (the report), the name and size are the
    network's, as train-project's Model: line, state.json and the exports give them."""
    from deepdanbooru.project.config import load_config
    from deepdanbooru.report.summary import model_text

    state = read_state(reference)
    trainable, frozen = state["parameters"]["trainable"], state["parameters"]["non_trainable"]
    assert state["network"] == NETWORK and (reference / FINAL).is_file()
    fresh = make_project(tmp_path / "fresh", *sample_dataset, **SETUP)
    tags = len((fresh / "tags.txt").read_text().split())
    model = {r.name: r for r in training_preflight(fresh, source_model=folder)}["model"]
    assert (model.status, model.detail) == ("PASS", (
        f"{NETWORK} (the network of --source-model {folder}, exported as {FINAL}; the source's network trains, not "
        f"one built from project.json's model vit_small_patch16): input 32x32x3, {trainable + frozen:,} parameters "
        f"in the checkpoint's tensors, its head mapped onto {tags} tags"))
    assert model_text(load_config(reference), state) == (
        f"{NETWORK}, 32x32, {trainable + frozen:,} parameters ({trainable:,} trainable); the --source-model's "
        "network (project.json's model vit_small_patch16 did not train)")
    # Without --source-model preflight cannot know the source: it names project.json's model, as before.
    plain = {r.name: r for r in training_preflight(fresh)}["model"]
    assert plain.detail.startswith("vit_small_patch16: input 32x32x3")
