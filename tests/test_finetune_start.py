"""train-project --source-model measures the source before the first step: the history starts with it and the
best export is never worse than it. The expected figures are computed here from the source's own scores."""

import json

import numpy as np
import pytest
from train_helpers import make_project

from deepdanbooru.errors import TrainingError

MODEL = "resnet_small"
UNKNOWN = ["tag_the_project_lacks", "another_one"]


def tiny_source(n_tags):
    """No batch normalization: with a learning rate of 1e-30 its outputs cannot move at all."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(n_tags, activation="sigmoid")(x))


@pytest.fixture
def source(tmp_path, sample_dataset):
    """A source that knows the first ten sample tags (the first one spelled otherwise) and two others."""
    from deepdanbooru.training.export import export_model

    tags = sample_dataset[1]
    source_tags = [tags[0].replace("_", " ").title(), *tags[1:10], *UNKNOWN]
    path = tmp_path / "source.keras"
    export_model(tiny_source(len(source_tags)), path, tags=source_tags)
    return path, source_tags


def labels(tag_strings, tags):
    return np.array([[tag in set(text.split()) for tag in tags] for text in tag_strings], dtype=bool)


def expected_start(project, source_path, source_tags):
    """The source's scores on the validation split, mapped by name, a new tag at its prior; and its figures."""
    import keras

    from deepdanbooru.captions import tag_key
    from deepdanbooru.pipeline import inference_dataset
    from deepdanbooru.training.train import plan_training

    plan = plan_training(project, source_path)
    images = inference_dataset(plan.validation.paths(), height=32, width=32, batch_size=4, max_image_pixels=10 ** 8)
    raw = np.concatenate([np.asarray(keras.models.load_model(source_path)(batch["image"])) for batch in images])
    column = {tag_key(tag): index for index, tag in enumerate(source_tags)}
    counts = labels(plan.train.tag_strings, plan.tags).sum(axis=0)
    prior = (counts + 0.5) / (len(plan.train) + 1)
    scores = np.stack([raw[:, column[tag_key(tag)]] if tag_key(tag) in column else np.full(len(raw), prior[j])
                       for j, tag in enumerate(plan.tags)], axis=1).astype(np.float64)
    truth = labels(plan.validation.tag_strings, plan.tags)
    predicted = scores >= 0.5
    tp, fp, fn = ((predicted & truth).sum(0), (predicted & ~truth).sum(0), (~predicted & truth).sum(0))
    has = truth.any(axis=0)
    f1 = np.where(tp > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
    clipped = np.clip(scores, 1e-7, 1 - 1e-7)
    loss = -(truth * np.log(clipped) + ~truth * np.log(1 - clipped)).mean()
    shared = [j for j, tag in enumerate(plan.tags) if tag_key(tag) in column]
    return plan, {
        "micro_f1": 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()),
        "macro_f1": f1[has].mean(),
        "loss": loss,
        "ap": {plan.tags[j]: average_precision(scores[:, j], truth[:, j]) for j in shared},
    }


def average_precision(scores, truth, bins=1000):
    """Precision at each positive's score, averaged over the positives (None without any); scores within one
    of the metric's 1/1000 bins count as tied, as validation counts them."""
    if not truth.any():
        return None
    slots = np.minimum(np.floor(scores * bins), bins)
    return float(np.mean([truth[slots >= slot].sum() / (slots >= slot).sum() for slot in slots[truth]]))


@pytest.mark.slow
def test_the_history_and_the_best_export_start_where_the_source_stands(tmp_path, sample_dataset, source):
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    source_path, source_tags = source
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, validation_fraction=0.5,
                           export_model_per_epoch=0)
    plan, expected = expected_start(project, source_path, source_tags)
    lines = []
    train_project(project, source_model=source_path, echo=lines.append)

    history = read_history(project / "logs" / "history.jsonl")
    start = history[0]
    assert (start["kind"], start["trigger"], start["used_epoch"], start["used_minibatch"], start["used_sample"]) == \
        ("validation", "start", 0, 0, 0)
    assert start["samples"] == len(plan.validation) == 11
    assert start["micro_f1"] == pytest.approx(expected["micro_f1"])
    assert start["macro_f1"] == pytest.approx(expected["macro_f1"])
    assert start["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    assert all(row["used_minibatch"] > 0 for row in history[1:])
    assert f"Start: --source-model source.keras as it is, measured on the validation split before the first step " \
           f"(10 tags it knows, {len(plan.tags) - 10} at their prior)" in lines

    written = json.loads((project / "logs" / "source_tag_ap.json").read_text())
    assert written["source_model"] == str(source_path) and written["tags"] == 10
    assert list(written["ap"]) == plan.tags[:10]  # in tags.txt's spelling, the tags the source does not know left out
    # The run ends by setting its last figures beside the source's; 11 validation posts give no tag 10 positives.
    final = next(i for i, line in enumerate(lines) if line.startswith("Final validation"))
    measured = sum(value is not None for value in written["ap"].values())
    assert lines[final + 1].startswith(f"Kept from the source: none of the {measured} tags it knew has 10 validation "
                                       f"positives, too few to tell a lost tag from noise")
    for tag, value in expected["ap"].items():
        assert written["ap"][tag] == (None if value is None else pytest.approx(value, abs=1e-9)), tag
    # evaluate-project --metrics shows the same figures beside the fine-tune's own, per tag.
    from click.testing import CliRunner

    from deepdanbooru.cli import main

    measured = CliRunner().invoke(main, ["evaluate-project", str(project), "--metrics", "--format", "json"])
    assert measured.exit_code == 0, measured.output
    rows = {row["tag"]: row for row in json.loads(measured.output.strip().splitlines()[-1])["per_tag"]}
    assert {tag: rows[tag]["source_ap"] for tag in plan.tags} == {
        tag: None if written["ap"].get(tag) is None else pytest.approx(written["ap"][tag], abs=1e-6)
        for tag in plan.tags}

    best = json.loads((project / f"model-{MODEL}.best.json").read_text())
    assert best["start"] == {"metric": "macro_f1", "value": pytest.approx(start["macro_f1"]), "used_minibatch": 0}
    validations = [row for row in history if row["kind"] == "validation"]
    assert best["value"] == pytest.approx(max(row["macro_f1"] for row in validations))
    assert best["value"] >= start["macro_f1"]


def scores_of(path, images):
    import keras

    return np.asarray(keras.models.load_model(path)(images))


@pytest.mark.slow
def test_a_run_that_cannot_beat_the_start_keeps_it_as_the_best_across_stops(tmp_path, sample_dataset, source):
    """A learning rate of 1e-30 leaves the weights as they start: no validation beats the start, the best export
    is the starting weights, and resuming after each --time-limit stop measures no second start."""
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    source_path, source_tags = source
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, validation_fraction=0.5,
                           validation_frequency_slices=1, export_model_per_epoch=0, learning_rate=1e-30)
    runs = []
    for _ in range(6):
        lines = []
        train_project(project, source_model=source_path, echo=lines.append, time_limit=1e-3)
        runs.append(lines)
        if not lines[-1].startswith("Stopped for the time limit"):
            break
    assert len(runs) >= 2
    for lines in runs[:-1]:
        at_stop = [line for line in lines if line.startswith("Validation at the stop (step ")]
        assert len(at_stop) == 1 and not any(line.startswith("Final validation") for line in lines)
    assert sum(line.startswith("Start: ") for line in runs[0]) == 2
    assert not any(line.startswith("Start: ") for lines in runs[1:] for line in lines)

    history = read_history(project / "logs" / "history.jsonl")
    starts = [row for row in history if row.get("trigger") == "start"]
    assert len(starts) == 1 and history[0] is starts[0]
    best = json.loads((project / f"model-{MODEL}.best.json").read_text())
    assert (best["used_minibatch"], best["value"]) == (0, pytest.approx(starts[0]["macro_f1"]))
    assert best["start"]["value"] == pytest.approx(starts[0]["macro_f1"])
    assert (f"Best: model-{MODEL}.best.keras holds the starting weights (the source model as it was, macro_f1 "
            f"{best['value']:.4f} at step 0); no validation since beat them") in runs[-1]
    images = np.random.default_rng(0).random((3, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(scores_of(project / f"model-{MODEL}.best.keras", images)[:, :10],
                               scores_of(source_path, images)[:, :10], rtol=1e-6)


def test_a_diverging_run_leaves_the_start_as_the_best_export(tmp_path, sample_dataset, source):
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    source_path, _ = source
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, validation_fraction=0.5,
                           validation_frequency_slices=1, learning_rate=1e30)
    with pytest.raises(TrainingError, match="non-finite|no longer finite"):
        train_project(project, source_model=source_path, echo=lambda line: None)
    start = read_history(project / "logs" / "history.jsonl")[0]
    best = json.loads((project / f"model-{MODEL}.best.json").read_text())
    assert start["trigger"] == "start" and best["used_minibatch"] == 0
    assert best["value"] == pytest.approx(start["macro_f1"])
    assert (project / f"model-{MODEL}.best.keras").is_file()


@pytest.mark.slow
def test_a_run_stopped_before_its_first_checkpoint_starts_again_from_its_source(tmp_path, sample_dataset, source):
    """Run again without --source-model (as a resumed run is), it starts from the source again, not from scratch
    with its frozen blocks random."""
    from deepdanbooru.training.monitors import Monitor
    from deepdanbooru.training.train import train_project

    class Crash(Monitor):
        def on_step(self, progress, position):
            raise RuntimeError("stopped before the first checkpoint")

    source_path, _ = source
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, checkpoint_frequency_mb=100)
    with pytest.raises(RuntimeError, match="before the first checkpoint"):
        train_project(project, source_model=source_path, echo=lambda *_: None, monitors=[Crash()])
    record = project / "checkpoints" / "start.json"
    assert json.loads(record.read_text()) == {"source_model": str(source_path), "source_tags": None}
    assert not (project / "checkpoints" / "checkpoint").exists()

    lines = []
    train_project(project, echo=lines.append)
    assert (f"notice: the run started from --source-model {source_path} stopped before its first checkpoint: this "
            f"one starts from it again ({record}; delete it to train from scratch)") in lines
    state = json.loads((project / "checkpoints" / "state.json").read_text())
    assert state["source"] == str(source_path) and state["network"] != MODEL  # the source's network trains

    other = make_project(tmp_path / "q", *sample_dataset, epoch_count=1)
    (other / "checkpoints").mkdir()
    gone = tmp_path / "gone.keras"
    (other / "checkpoints" / "start.json").write_text(json.dumps({"source_model": str(gone), "source_tags": None}))
    with pytest.raises(TrainingError, match=rf"{gone}: --source-model not found .* \(the source the stopped run "
                                            rf"started from, as {other / 'checkpoints' / 'start.json'} records "
                                            r"it; delete"):
        train_project(other, echo=lambda *_: None)
