"""The recipe keys through train-project: every key on, killed and resumed; growing a model's vocabulary."""

import gc
import json
import shutil

import numpy as np
import pytest
from train_helpers import assert_same_weights, killed_copy, make_project, read_state, weights

from deepdanbooru.errors import ModelError
from deepdanbooru.training.monitors import Monitor
from deepdanbooru.training.train import plan_training, train_project

# Every recipe key that changes training turns on here (head_bias_init needs a head with a bias:
# resnet_small has none, so it is refused below and tested on a dense head in test_recipe.py).
RECIPE = {
    "loss": "asymmetric", "asl_gamma_neg": 3, "asl_gamma_pos": 1, "asl_clip": 0.1,
    "optimizer": "adamw", "weight_decay": 0.02, "learning_rate": 0.01,
    "lr_schedule": "warmup_cosine", "warmup_epochs": 0.5, "min_learning_rate": 0.0001,
    "ema_decay": 0.9, "tag_loss_weights": "log_frequency",
    "validation_fraction": 0.25, "validation_frequency_slices": 0,
}
LATER_EXPORTS = ["model-resnet_small.e2.keras", "model-resnet_small.keras", "model-resnet_small.best.keras"]


class Rates(Monitor):
    """The optimizer's rate at each slice end (the trainer logs it there), by used_minibatch."""

    def __init__(self):
        self.rates = {}

    def on_slice_end(self, progress, checkpoint, logs):
        self.rates[progress.used_minibatch] = logs["learning_rate"]


def _trainer(plan, echo):
    """A SliceTrainer set up (model, restore) on the plan's devices, without monitors."""
    from deepdanbooru.training.loop import SliceTrainer
    from deepdanbooru.training.strategy import choose_strategy

    return SliceTrainer(plan, choose_strategy(plan.devices, plan.role), [], echo)


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory, sample_dataset):
    project = make_project(tmp_path_factory.mktemp("recipe") / "project", *sample_dataset, **RECIPE)
    lines = []
    train_project(project, echo=lines.append)
    return project, lines


@pytest.mark.slow
def test_every_recipe_key_resumes_exactly(recipe_run, tmp_path):
    reference, lines = recipe_run
    state = read_state(reference)
    assert (state["used_epoch"], state["used_minibatch"]) == (2, 10)  # 20 training records: 5 steps an epoch
    metrics = json.loads((reference / "model-resnet_small.metrics.json").read_text())
    assert metrics["weights"] == "ema" and metrics["ema_decay"] == 0.9
    # The final export is the average the last checkpoint holds, not the trained weights beside it.
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(reference / "checkpoints" / "ckpt-6"))
    exported = weights(reference / "model-resnet_small.keras")
    averages = [reader.get_tensor(f"ema/averages/{i}/.ATTRIBUTES/VARIABLE_VALUE") for i in range(len(exported))]
    for a, b in zip(exported, averages):
        np.testing.assert_array_equal(a, b)
    # (The checkpoint reaches the trained stem kernel through the optimizer's list of variables.)
    trained_stem = reader.get_tensor("optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE")
    assert trained_stem.shape == exported[0].shape and not np.array_equal(trained_stem, exported[0])

    # Killed after the first slice of epoch 2: resume from that checkpoint.
    project = killed_copy(reference, tmp_path / "resumed", "ckpt-4", LATER_EXPORTS)
    resumed = []
    rates = Rates()
    train_project(project, echo=resumed.append, monitors=[rates])
    for name in LATER_EXPORTS[:2]:
        assert_same_weights(reference / name, project / name)
    # Resumed at used_minibatch 7; the rate is set per minibatch from it (warmup round(0.5 * 5) = 2 steps).
    # Slices of 2 steps end after steps 7-8 and 9: the optimizer then holds the rate of step 8, then 9.
    import math

    expected = {u + 1: 0.0001 + (0.01 - 0.0001) * 0.5 * (1 + math.cos(math.pi * (u - 2) / 8)) for u in (8, 9)}
    assert rates.rates.keys() == expected.keys()
    assert [rates.rates[k] for k in expected] == pytest.approx(list(expected.values()), rel=1e-6)


@pytest.mark.slow
def test_vocabulary_growth_keeps_rows_and_exports_the_new_vocabulary(recipe_run, tmp_path, sample_dataset):
    reference, _ = recipe_run
    source = reference / "model-resnet_small.keras"
    database, tags = sample_dataset
    # The file records which tags it was trained on (no sidecar needed); drop two, add three, reorder.
    copy = tmp_path / "copied.keras"
    shutil.copyfile(source, copy)
    new_tags = ["new_a", *reversed(tags[2:]), "new_b", "new_c"]
    project = make_project(tmp_path / "grown", database, new_tags, epoch_count=1)
    lines = []
    trainer = _trainer(plan_training(project, source_model=copy), lines.append)
    report = project / "logs" / "vocabulary.txt"
    assert (f"--source-model copied.keras: kept 15 tags, 3 new, 2 dropped (listed in {report}); new tags start "
            "at their frequency's prior") in lines
    listed = [line.split("\t") for line in report.read_text().splitlines()[1:]]
    assert listed == [["new" if tag.startswith("new_") else "kept", tag] for tag in new_tags] + \
        [["dropped", tag] for tag in tags[:2]]
    source_weights, grown_weights = weights(source), [w.numpy() for w in trainer.model.weights]
    kernel_index = [i for i, w in enumerate(source_weights) if w.shape[-1] == len(tags) and w.ndim == 4][0]
    for a, b in zip(source_weights[:kernel_index], grown_weights[:kernel_index]):
        np.testing.assert_array_equal(a, b)
    old, grown = source_weights[kernel_index], grown_weights[kernel_index]
    assert grown.shape[-1] == len(new_tags)
    for i, tag in enumerate(new_tags):
        if tag in tags:
            np.testing.assert_array_equal(grown[..., i], old[..., tags.index(tag)])

    # What the trainer exports is an ordinary model of the new vocabulary.
    import keras

    from deepdanbooru.training.export import export_model

    export_model(trainer.model, project / "grown.keras")
    reloaded = keras.models.load_model(project / "grown.keras")
    assert reloaded.output_shape == (None, len(new_tags))
    for a, b in zip(reloaded.get_weights(), grown_weights):
        np.testing.assert_array_equal(a, b)


def test_source_tags_refusals_and_log_prior_without_bias(tmp_path, sample_dataset):
    from deepdanbooru.models import build_model

    database, tags = sample_dataset
    project = make_project(tmp_path / "p", database, tags)
    deepdanbooru_model = tmp_path / "model.keras"
    build_model("resnet_small", (32, 32, 3), 5).save(deepdanbooru_model)
    with pytest.raises(ModelError, match="has 17 tags; give --source-tags"):
        train_project(project, source_model=deepdanbooru_model, echo=lambda *_: None)
    (tmp_path / "source-tags.txt").write_text("\n".join(tags[:4]) + "\n")
    with pytest.raises(ModelError, match="model.keras: output: has 5 units but its tags list 4"):
        train_project(project, source_model=deepdanbooru_model, source_tags=tmp_path / "source-tags.txt",
                      echo=lambda *_: None)
    with pytest.raises(ModelError, match="--source-tags is for --source-model"):
        plan_training(project, source_tags=tmp_path / "source-tags.txt")
    (project / "project.json").write_text(json.dumps({**json.loads((project / "project.json").read_text()),
                                                      "head_bias_init": "log_prior"}))
    with pytest.raises(ModelError, match="project.json: head_bias_init: log_prior sets the output bias, but "
                                          "resnet_small's head"):
        plan_training(project)


@pytest.mark.slow
def test_ema_turned_on_and_off_between_runs(recipe_run, tmp_path, caplog):
    """Off: a checkpoint's average is left unread. On over a checkpoint without one: it starts at the restored
    weights, and checkpoint numbering goes on. Neither restore warns about values it left unread (the average, and
    the best-model state of a run restored here without monitors)."""
    reference, _ = recipe_run
    gc.collect()  # what earlier tests left to collect must not be counted below
    caplog.clear()
    project = tmp_path / "toggled"
    shutil.copytree(reference, project)
    (project / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-4"\nall_model_checkpoint_paths: "ckpt-4"\n')
    config = json.loads((project / "project.json").read_text())
    (project / "project.json").write_text(json.dumps({**config, "ema_decay": None}))
    without = _trainer(plan_training(project), lambda *_: None)
    assert without.ema is None and without.counters.used_minibatch == 7
    assert without.save_checkpoint().endswith("ckpt-5")
    (project / "project.json").write_text(json.dumps({**config, "ema_decay": 0.5}))
    lines = []
    again = _trainer(plan_training(project), lines.append)
    assert any("ckpt-5 holds no weight average; ema_decay starts it at the restored weights" in line
               for line in lines)
    for weight, average in zip(again.ema.weights, again.ema.averages):
        np.testing.assert_array_equal(weight.numpy(), average.numpy())
    assert again.save_checkpoint().endswith("ckpt-6")
    del without, again
    gc.collect()  # TensorFlow warns about a restore's unmatched values when the restore is collected
    assert not [r.getMessage() for r in caplog.records if "Value in checkpoint could not be found" in r.getMessage()]
