"""trainable_blocks (only the last N blocks of the trunk and the head train) with the features it meets, and the
exports' name after the network that trains."""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from train_helpers import assert_same_weights, killed_copy, make_project, read_state, set_config

from deepdanbooru.cli import main
from deepdanbooru.errors import ModelError
from deepdanbooru.models.head import head_layer
from deepdanbooru.models.partial import partial_training
from deepdanbooru.project.config import load_config
from deepdanbooru.project.paths import ProjectPaths

TIMM = Path(__file__).resolve().parent / "fixtures" / "timm"
# What the vit_wd fixture builds (config.json: vit_base_patch16_224 with 2 blocks, 32 wide), named as it is.
NETWORK = "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32"


def _imported(fixture):
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    return import_checkpoint(TIMM / fixture).model


def _trained_names(model, blocks, name="resnet_small"):
    partial_training(model, name, blocks).freeze()
    return {layer.name for layer in model.layers if layer.trainable_weights}


# --- which layers train, on every family ---

@pytest.mark.parametrize("name, blocks, trains", [
    ("resnet_small", 1, lambda n: n.startswith("stage4_") or n == "head_conv"),
    ("resnet_small", 0, lambda n: n == "head_conv"),
])
def test_the_last_blocks_and_the_head_train_on_the_registry_models(name, blocks, trains):
    from deepdanbooru.models import build_model

    model = build_model(name, (32, 32, 3), 3)
    every = {layer.name for layer in model.layers if layer.trainable_weights}
    trained = _trained_names(model, blocks, name)
    assert trained == {n for n in every if trains(n)}
    assert head_layer(model).name in trained


@pytest.mark.parametrize("fixture, trains", [
    ("vit_wd", lambda n: n.startswith("vit_block1_") or n in ("vit_norm", "head_dense")),
    ("convnext_wd", lambda n: "_stage_3_" in n or n.endswith("_downsampling_conv_2")
     or n.endswith(("_downsampling_layernorm_2", "_head_layernorm")) or n == "head_dense"),
    ("swinv2_wd", lambda n: n.startswith(("swin_stage3_", "swin_merge3_")) or n in ("swin_norm", "head_dense")),
])
def test_the_last_block_and_the_head_train_on_imported_taggers(fixture, trains):
    model = _imported(fixture)
    every = {layer.name for layer in model.layers if layer.trainable_weights}
    assert _trained_names(model, 1) == {n for n in every if trains(n)}


def test_the_registry_vit_trains_its_last_blocks_and_says_its_share():
    from deepdanbooru.models import build_model

    model = build_model("vit_small_patch16", (32, 32, 3), 3)
    every = {layer.name for layer in model.layers if layer.trainable_weights}
    partial = partial_training(model, "vit_small_patch16", 2)
    total = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    partial.freeze()
    assert {layer.name for layer in model.layers if layer.trainable_weights} == {
        n for n in every if n.startswith(("vit_block10_", "vit_block11_")) or n in ("vit_norm", "head_dense")}
    assert partial.trainable == sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert partial.total == total
    assert partial.describe() == (f"Trainable: last 2 of 12 blocks + head, {partial.trainable / 1e6:.1f}M of "
                                  f"{total / 1e6:.1f}M parameters ({100 * partial.trainable / total:.0f}%)")
    assert partial_training(model, "vit_small_patch16", None) is None


# --- bad input ---

def test_more_blocks_than_the_model_has_names_both():
    with pytest.raises(ModelError, match=r"^project.json: trainable_blocks: is 3, but --source-model x has 2 "
                                         r"blocks; give 0 to 2 \(0: the head only\), or null to train every layer$"):
        partial_training(_imported("vit_wd"), "resnet_small", 3, "project.json", network="--source-model x")


def test_a_model_whose_blocks_no_family_places_is_refused():
    from test_layer_decay import _numbered_layers_model

    with pytest.raises(ModelError, match="^trainable_blocks: cannot tell which stage or block of resnet_small layer "
                                         "'conv2d_7' belongs to; trainable_blocks knows the layers"):
        partial_training(_numbered_layers_model(), "resnet_small", 1)


def _files(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


@pytest.mark.parametrize("blocks, source, message", [
    (3, "vit_wd", "trainable_blocks: is 3, but --source-model vit_wd ({}) has 2 blocks; give 0 to 2".format(NETWORK)),
    (1, "numbered", "trainable_blocks: cannot tell which stage or block of --source-model old.keras (old_tagger) "
                    "layer 'conv2d_7' belongs to"),
])
def test_a_refused_partial_fine_tune_writes_nothing(tmp_path, sample_dataset, blocks, source, message):
    from test_layer_decay import _numbered_layers_model

    from deepdanbooru.models.files import save_atomic

    database, tags = sample_dataset
    project = make_project(tmp_path / "p", database, tags, trainable_blocks=blocks)
    if source == "numbered":
        path = tmp_path / "old.keras"
        save_atomic(_numbered_layers_model(len(tags)), path, tags)
    else:
        path = TIMM / source  # its selected_tags.csv would lead to the project's categories.json
    before = _files(project)
    result = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(path)])
    assert result.exit_code == 2, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(f"error: {project / 'project.json'}: {message}"), last
    assert _files(project) == before


# --- the step: frozen weights stay, no optimizer state or average for them ---

def test_frozen_layers_keep_their_weights_and_get_no_optimizer_state_or_average():
    from deepdanbooru.models.optimizers import make_optimizer
    from deepdanbooru.training.ema import WeightAverage
    from deepdanbooru.training.step import TrainStep

    model = _imported("vit_wd")
    partial = partial_training(model, "vit_small_patch16", 1)
    partial.freeze()
    frozen = {layer.name: [w.copy() for w in layer.get_weights()] for layer in partial.frozen}
    trained = {layer.name: [w.copy() for w in layer.get_weights()] for layer in model.layers
               if layer.trainable_weights}
    optimizer = make_optimizer("adam", 0.01)
    optimizer.build(model.trainable_variables)
    ema = WeightAverage(model, 0.9, partial.frozen)
    strategy = tf.distribute.get_strategy()
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, ema=ema)
    n_tags = int(model.output_shape[-1])
    batch = {"image": tf.random.stateless_uniform((4, *model.input_shape[1:]), seed=[1, 2]),
             "label": tf.cast(tf.random.stateless_uniform((4, n_tags), seed=[3, 4]) < 0.3, tf.float32)}
    step.bind({key: tf.TensorSpec((None, *value.shape[1:]), value.dtype) for key, value in batch.items()})
    for _ in range(3):
        step(batch)
    for name, weights in frozen.items():
        for before, after in zip(weights, model.get_layer(name).get_weights()):
            np.testing.assert_array_equal(before, after)
    for name, weights in trained.items():
        assert any(not np.array_equal(b, a) for b, a in zip(weights, model.get_layer(name).get_weights())), name
    frozen_ids = {id(w) for layer in partial.frozen for w in layer.weights}
    assert frozen_ids and not frozen_ids & {id(w) for w in ema.weights}
    slots = sum(int(np.prod(v.shape)) for v in optimizer.variables) - 2  # less iterations and the learning rate
    assert slots == 2 * partial.trainable


# --- a whole run: features, resume, exports ---

LATER = [f"model-{NETWORK}.e2.keras", f"model-{NETWORK}.keras"]
# 24 posts, batch 8, a slice a minibatch: 3 checkpoints an epoch; exports after epoch 2 only.
RUN = dict(minibatch_size=8, checkpoint_frequency_mb=1, export_model_per_epoch=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sample_dataset):
    """A --source-model run of the 2-block ViT fixture, its vocabulary grown onto the sample's tags, with the last
    block trained, a head-only first epoch, layer_decay, EMA and gradient clipping, compiled by XLA (jit_compile's
    default "auto" compiles a ViT)."""
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path_factory.mktemp("partial") / "p", *sample_dataset, model="resnet_custom_v2",
                           image_width=32, image_height=32, trainable_blocks=1, freeze_backbone_epochs=1,
                           layer_decay=0.7, ema_decay=0.9, optimizer="adamw", learning_rate=0.01,
                           gradient_clip_norm=1.0, **RUN)
    lines = []
    train_project(project, source_model=TIMM / "vit_wd", echo=lines.append)
    return project, lines


@pytest.mark.slow
def test_a_partial_fine_tune_trains_the_last_block_exports_whole_models_and_resumes_exactly(tmp_path, reference):
    project, lines = reference
    source = _imported("vit_wd")
    assert any(line.startswith("Trainable: last 1 of 2 blocks + head, ") for line in lines), lines
    assert "Backbone unfrozen from epoch 2: trainable_blocks' last 1 of 2 blocks + head trains" in lines
    # Compiled throughout, the step compiled again after the unfreeze, with no fallback.
    assert sum(line.startswith('jit_compile "auto": the training step and validation compile') for line in lines) == 1
    assert not any("runs without XLA" in line for line in lines), lines
    # Named after the network that trained (project.json says resnet_custom_v2), wherever a tool looks.
    assert read_state(project)["exports"] == NETWORK and not list(project.glob("model-resnet_custom_v2*"))
    assert ProjectPaths(project).export_name("resnet_custom_v2") == NETWORK
    final = keras.models.load_model(project / LATER[1])  # whole, every layer trainable, plain Keras
    assert all(layer.trainable for layer in final.layers) and final.name == NETWORK
    for layer in source.layers:
        if not layer.weights or layer.name == "head_dense":
            continue
        same = all(np.array_equal(a, b) for a, b in zip(layer.get_weights(), final.get_layer(layer.name).get_weights()))
        assert same != (layer.name.startswith("vit_block1_") or layer.name == "vit_norm"), layer.name
    # Killed after the first slice of epoch 2: the resumed run ends on the same weights, bit for bit.
    resumed = killed_copy(project, tmp_path / "resumed", "ckpt-4", LATER)
    from deepdanbooru.training.train import train_project

    train_project(resumed, echo=lambda *_: None)
    for name in LATER:
        assert_same_weights(project / name, resumed / name)
    # Another trainable_blocks does not fit the checkpoint's optimizer state: refused, saying what changed.
    set_config(resumed, trainable_blocks=2)
    checkpoints = {p: p.stat().st_mtime_ns for p in (resumed / "checkpoints").iterdir()}
    result = CliRunner().invoke(main, ["train-project", str(resumed)])
    assert result.exit_code != 0
    assert f"{resumed / 'project.json'}: trainable_blocks was 1, now 2" in result.output.splitlines()[-1]
    assert {p: p.stat().st_mtime_ns for p in (resumed / "checkpoints").iterdir()} == checkpoints


# --- the exports' name, read without TensorFlow ---

def test_tools_find_the_exports_by_the_name_the_run_recorded(tmp_path):
    paths = ProjectPaths(tmp_path)
    assert paths.export_name("resnet_custom_v2") == "resnet_custom_v2"  # nothing trained yet
    (tmp_path / f"model-{NETWORK}.best.keras").write_bytes(b"x")
    # No state.json (checkpoints deleted, or a run stopped before its first): the one name the exports have.
    assert paths.export_name("resnet_custom_v2") == NETWORK
    (tmp_path / "model-resnet_custom_v2.keras").write_bytes(b"x")
    assert paths.export_name("resnet_custom_v2") == "resnet_custom_v2"
    paths.checkpoints.mkdir()
    (paths.checkpoints / "state.json").write_text(json.dumps({"version": 1, "exports": NETWORK}))
    assert paths.export_name("resnet_custom_v2") == NETWORK
    # Written before the record: project.json's model, as such a run named its exports.
    (paths.checkpoints / "state.json").write_text(json.dumps({"version": 1, "network": NETWORK}))
    assert paths.export_name("resnet_custom_v2") == "resnet_custom_v2"
    shutil.rmtree(paths.checkpoints)


def test_a_network_keras_named_keeps_the_projects_model_name():
    from deepdanbooru.project.paths import safe_export_name

    assert [safe_export_name(n) for n in ("functional_3", "model", "vit_base_patch16_448", "a/b.c")] == \
        ["", "", "vit_base_patch16_448", "a_b_c"]


def test_a_run_keeps_the_export_name_its_checkpoint_records(tmp_path):
    from deepdanbooru.training.network import Network, NetworkState, export_name

    model, unnamed = _imported("vit_wd"), keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    # Fresh: the network's own name from a source; project.json's model from the table or for a name Keras made.
    assert export_name("resnet_custom_v2", model, "/x/wd", None) == NETWORK
    assert export_name("resnet_custom_v2", model, None, None) == "resnet_custom_v2"
    assert export_name("resnet_custom_v2", unnamed, "/x/old.h5", None) == "resnet_custom_v2"
    # A checkpoint that records the network but not yet the exports' name (as fine-tunes wrote them before):
    # its exports are named after project.json's model, and so stay.
    older = tf.Module(name="network")
    older.network_name, older.source, older.architecture = (tf.Variable(v) for v in (NETWORK, "/x/wd", "{}"))
    written = tf.train.Checkpoint(network=older).write(str(tmp_path / "older" / "ckpt-1"))
    assert export_name("resnet_custom_v2", model, "/x/wd", written) == "resnet_custom_v2"
    recorded = NetworkState(Network(NETWORK, "/x/wd", "{}", exports=NETWORK))
    written = tf.train.Checkpoint(network=recorded).write(str(tmp_path / "newer" / "ckpt-1"))
    assert export_name("resnet_custom_v2", model, "/x/wd", written) == NETWORK


def test_preflight_says_a_changed_trainable_blocks_will_be_refused(tmp_path):
    from deepdanbooru.preflight.checks import Run, _mismatch

    (tmp_path / "project.json").write_text(json.dumps({"trainable_blocks": 2}))
    run = Run(tmp_path)
    run.config = load_config(tmp_path)
    assert _mismatch(run, {"model": run.config.model, "trainable_blocks": 1}) == "trainable_blocks 1 (project.json: 2)"
    assert _mismatch(run, {"model": run.config.model, "trainable_blocks": 2}) is None
    # A state.json written before the key existed: every layer trained.
    assert _mismatch(run, {"model": run.config.model}) == "trainable_blocks null (project.json: 2)"
