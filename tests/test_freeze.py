"""freeze_backbone_epochs across the features it meets: DeepDanbooru-style models, every optimizer, exports."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from deepdanbooru.models.head import head_layer, head_layers, trunk_layers
from deepdanbooru.models.optimizers import make_optimizer
from deepdanbooru.training.freeze import BackboneFreeze
from deepdanbooru.training.step import TrainStep

OPTIMIZERS = ("adam", "adamw", "lamb", "sgd", "rmsprop")
RATE = 0.01
FROZEN_STEPS = 20
MEASURED = (1, 10, 50)


def deepdanbooru_style(n_tags=3, seed=0):
    """Layers named by Keras's counter, head Conv2D(n_tags, 1x1) -> GlobalAveragePooling2D -> sigmoid."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Activation("relu")(x)
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(x)
    x = keras.layers.Conv2D(n_tags, 1, use_bias=False)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Activation("sigmoid")(x))


def test_the_head_of_a_deepdanbooru_style_model_is_found_by_structure():
    model = deepdanbooru_style()
    head = head_layers(model)
    assert [type(layer).__name__ for layer in head] == ["Conv2D", "GlobalAveragePooling2D", "Activation"]
    assert head[0] is head_layer(model)
    assert [type(layer).__name__ for layer in trunk_layers(model)] == ["Conv2D", "BatchNormalization", "Conv2D"]
    lines = []
    BackboneFreeze(model, None, 1, echo=lines.append).at_epoch(0, 1)
    assert [v.path for v in model.trainable_variables] == [v.path for v in head[0].trainable_variables]
    assert lines == ["Backbone frozen for epochs 1 to 1: only the head trains"]


@pytest.mark.parametrize("name", [
    "resnet_small", "vit_small_patch16",
    pytest.param("convnext_tiny", marks=pytest.mark.slow), pytest.param("efficientnetv2_b0", marks=pytest.mark.slow)])
def test_only_the_trunk_freezes_on_every_model_family(name):
    from deepdanbooru.models import build_model

    model = build_model(name, (32, 32, 3), 3)
    freeze = BackboneFreeze(model, None, 1, echo=lambda *_: None)
    freeze.at_epoch(0, 1)
    head = head_layer(model)
    assert head.name in ("head_conv", "head_dense")
    assert [v.path for v in model.trainable_variables] == [v.path for v in head.trainable_variables]
    freeze.at_epoch(1, 1)
    assert len(model.trainable_variables) > 10


@pytest.mark.parametrize("fixture, constant", [("swinv2_wd", "swin_stage0_block1_mask/kernel"),
                                               ("eva02_wd", "vit_rope_sin/kernel")])
def test_a_layer_built_non_trainable_stays_so_when_the_trunk_unfreezes(fixture, constant):
    from pathlib import Path

    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    # An imported SwinV2 stores its shifted windows' masks, an EVA02 its rotary tables, as the kernels of
    # non-trainable Dense layers.
    model = import_checkpoint(Path(__file__).parent / "fixtures" / "timm" / fixture).model
    trained = [v.path for v in model.trainable_variables]
    assert constant not in trained and constant in [v.path for v in model.non_trainable_variables]
    lines = []
    freeze = BackboneFreeze(model, None, 1, echo=lines.append)
    freeze.at_epoch(0, 1)
    assert [v.path for v in model.trainable_variables] == ["head_dense/kernel", "head_dense/bias"]
    freeze.at_epoch(1, 1)
    assert [v.path for v in model.trainable_variables] == trained
    # No freezing at all (freeze_backbone_epochs 0) changes nothing.
    freeze = BackboneFreeze(model, None, 0, echo=lines.append)
    freeze.at_epoch(0, 0)
    assert [v.path for v in model.trainable_variables] == trained
    assert lines == ["Backbone frozen for epochs 1 to 1: only the head trains",
                     "Backbone unfrozen from epoch 2: every layer trains"]


def _batches(count, seed=1):
    rng = np.random.default_rng(seed)
    return [{"image": tf.constant(rng.uniform(size=(4, 8, 8, 3)).astype(np.float32)),
             "label": tf.constant((rng.uniform(size=(4, 3)) < 0.4).astype(np.float32))} for _ in range(count)]


def _optimizer(name, model):
    optimizer = make_optimizer(name, RATE, weight_decay=0.01 if name in ("adamw", "lamb") else None)
    optimizer.build(model.trainable_variables)  # every variable: the trainer builds before freezing
    return optimizer


def _trunk_steps(model, optimizer, step, batches) -> dict[int, float]:
    """|trunk update| / learning rate after each of the measured steps."""
    trunk = [v for layer in trunk_layers(model) for v in layer.trainable_variables]
    found = {}
    for number, batch in enumerate(batches, start=1):
        before = [v.numpy() for v in trunk]
        step.bind({key: tf.TensorSpec((None, *value.shape[1:]), value.dtype) for key, value in batch.items()})
        step(batch)
        if number in MEASURED:
            moved = np.sqrt(sum(np.sum((v.numpy() - b) ** 2) for v, b in zip(trunk, before)))
            found[number] = float(moved) / RATE
    return found


def unfreezing_against_a_fresh_optimizer(name) -> tuple[dict, dict]:
    """(trunk step / rate after unfreezing, the same from a fresh optimizer on the same weights and batches)."""
    strategy = tf.distribute.get_strategy()
    batches = _batches(FROZEN_STEPS + max(MEASURED))
    model = deepdanbooru_style()
    optimizer = _optimizer(name, model)
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, count_metrics=False)
    freeze = BackboneFreeze(model, optimizer, 1, on_change=step.retrace, echo=lambda *_: None)
    freeze.at_epoch(0, 0)
    _trunk_steps(model, optimizer, step, batches[:FROZEN_STEPS])
    freeze.at_epoch(1, 0)
    fresh_model = deepdanbooru_style(seed=5)
    fresh_model.set_weights(model.get_weights())
    fresh_optimizer = _optimizer(name, fresh_model)
    fresh_step = TrainStep(strategy, fresh_model, fresh_optimizer, "binary_crossentropy", loss_scaled=False,
                           count_metrics=False)
    unfrozen = _trunk_steps(model, optimizer, step, batches[FROZEN_STEPS:])
    fresh = _trunk_steps(fresh_model, fresh_optimizer, fresh_step, batches[FROZEN_STEPS:])
    return unfrozen, fresh


def test_without_a_trunk_to_unfreeze_the_optimizer_state_is_kept():
    """trainable_blocks 0 leaves only the head trainable: freeze_backbone_epochs then changes nothing."""
    model = deepdanbooru_style()
    for layer in trunk_layers(model):
        layer.trainable = False
    optimizer = _optimizer("adam", model)
    for variable in optimizer.variables:
        variable.assign(tf.ones_like(variable))
    lines = []
    freeze = BackboneFreeze(model, optimizer, 1, echo=lines.append)
    freeze.at_epoch(0, 0)
    freeze.at_epoch(1, 0)
    assert lines == [] and all(np.all(variable.numpy() == 1) for variable in optimizer.variables)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_after_unfreezing_the_trunk_steps_as_with_a_fresh_optimizer(name):
    unfrozen, fresh = unfreezing_against_a_fresh_optimizer(name)
    assert all(value > 0 for value in fresh.values())
    for number in MEASURED:
        assert unfrozen[number] == pytest.approx(fresh[number], rel=0.05), (name, number, unfrozen, fresh)


@pytest.mark.slow
def test_deepdanbooru_h5_source_freezes_its_trunk_and_the_best_export_is_whole(tmp_path, sample_dataset):
    """A DeepDanbooru 1.0 .h5 (Keras-numbered layers) with a frozen first epoch: only its trunk freezes,
    the best model exported inside the frozen epoch is fully trainable and continues as a source."""
    from test_models import write_tf_keras2_h5
    from train_helpers import make_project

    from deepdanbooru.training.train import train_project

    database, tags = sample_dataset
    source = tmp_path / "deepdanbooru-v1.h5"
    write_tf_keras2_h5(source, n_tags=len(tags), mixed=False)
    # By loss, which the head's first steps lower: a validation in the frozen epoch beats the source's start
    # (the first best, at step 0) and exports the best model while the trunk is frozen.
    keys = dict(image_width=16, image_height=16, freeze_backbone_epochs=1, epoch_count=1,
                validation_fraction=0.25, validation_frequency_slices=1, best_model_metric="loss")
    project = make_project(tmp_path / "frozen", database, tags, **keys)
    lines = []
    train_project(project, source_model=source, echo=lines.append)
    assert "Backbone frozen for epochs 1 to 1: only the head trains" in lines
    # DeepDanbooru 1.0 names its networks after their model row: the exports carry that name.
    assert json.loads((project / "model-resnet_custom_v3.best.json").read_text())["used_minibatch"] > 0
    best = keras.models.load_model(project / "model-resnet_custom_v3.best.keras")
    assert all(layer.trainable for layer in best.layers)
    original = keras.models.load_model(source, compile=False)
    trunk_kernel = next(layer for layer in trunk_layers(original) if layer.name == "conv2d").get_weights()[0]
    np.testing.assert_array_equal(best.get_layer("conv2d").get_weights()[0], trunk_kernel)
    assert not np.array_equal(best.get_layer("conv2d_2").get_weights()[0],
                              original.get_layer("conv2d_2").get_weights()[0])

    again = make_project(tmp_path / "again", database, tags, **{**keys, "epoch_count": 2})
    lines = []
    train_project(again, source_model=project / "model-resnet_custom_v3.best.keras", echo=lines.append)
    assert "Backbone unfrozen from epoch 2: every layer trains" in lines
    final = keras.models.load_model(again / "model-resnet_custom_v3.keras")
    assert not np.array_equal(final.get_layer("conv2d").get_weights()[0], trunk_kernel)
