"""Parameter groups: what each family exempts from weight decay, and layer_decay's per-variable learning rates."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from train_helpers import assert_same_weights, killed_copy, make_project, read_state

from deepdanbooru.errors import ModelError
from deepdanbooru.models import build_model
from deepdanbooru.models.optimizers import decay_exempt, layer_rate_factors, make_optimizer

DECAY = 0.5
SHAPE = (32, 32, 3)


def _gradients(model, seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=tuple(v.shape)).astype(np.float32)) for v in model.trainable_variables]


def _one_step(name, layer_decay, loss_scaled=False, weight_decay=None, zero=False):
    """(weights before, weights after) of resnet_small after one compiled step with fixed gradients."""
    model = build_model("resnet_small", SHAPE, 3, seed=0)
    optimizer = make_optimizer(name, 0.01, weight_decay=weight_decay,
                               decay_exempt_variables=decay_exempt(model, "resnet_small"),
                               rate_factors=layer_rate_factors(model, "resnet_small", layer_decay))
    if loss_scaled:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    gradients = [tf.zeros_like(g) for g in _gradients(model)] if zero else _gradients(model)
    step = lambda: optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # noqa: E731
    # The trainer's step is compiled; Keras's own (unfused) updates trace slowly, so those run eagerly here.
    (tf.function(step) if name in ("adam", "sgd") else step)()
    return before, {v.path: v.numpy() for v in model.trainable_variables}


def _step_size(before, after, path):
    return float(np.linalg.norm(after[path].astype(np.float64) - before[path]))


STAGE1 = "stage1_block0_1_conv/kernel"  # unit 0 of resnet_small's 4 stages
STEM = "stem_conv/kernel"
HEAD = "head_conv/kernel"


def test_layer_decay_counts_the_blocks_of_the_model_it_is_given(monkeypatch):
    # A source model shallower than the registry row of project.json's `model` (an imported 2-block ViT
    # trained as vit_small_patch16, whose row has 12): its last block is one step below the head.
    from deepdanbooru import registry

    monkeypatch.setitem(registry.MODELS, "vit_two_blocks", registry.Architecture((32,), (2,), "pooled", "vit",
                                                                                  patch=8, heads=4))
    model = build_model("vit_two_blocks", SHAPE, 3, seed=0)
    factors = {variable.path: factor for variable, factor in layer_rate_factors(model, "vit_small_patch16", DECAY)}
    assert factors["vit_block1_mlp1/kernel"] == pytest.approx(DECAY)
    assert factors["vit_block0_mlp1/kernel"] == pytest.approx(DECAY ** 2)
    assert factors["vit_patch_embedding/kernel"] == pytest.approx(DECAY ** 3)


@pytest.mark.parametrize("name, loss_scaled", [("adam", False), ("sgd", False), ("rmsprop", False),
                                               ("lamb", False), ("adam", True)],
                         ids=["adam", "sgd", "rmsprop", "lamb", "adam-loss-scaled"])
def test_block0_moves_layer_decay_to_the_L_as_far_as_the_head(name, loss_scaled):
    plain_before, plain = _one_step(name, None, loss_scaled)
    decayed_before, decayed = _one_step(name, DECAY, loss_scaled)
    ratio = {path: _step_size(decayed_before, decayed, path) / _step_size(plain_before, plain, path)
             for path in (STAGE1, STEM, HEAD)}
    assert ratio[HEAD] == pytest.approx(1.0, abs=1e-6)
    assert ratio[STAGE1] / ratio[HEAD] == pytest.approx(DECAY ** 4, abs=1e-5)
    assert ratio[STEM] / ratio[HEAD] == pytest.approx(DECAY ** 5, abs=1e-5)


def test_decoupled_weight_decay_follows_the_layer_rate():
    # Zero gradients: Adam's step is zero, what moves is var * weight_decay * rate.
    before, after = _one_step("adamw", DECAY, weight_decay=0.1, zero=True)
    for path, factor in ((STAGE1, DECAY ** 4), (STEM, DECAY ** 5), (HEAD, 1.0)):
        np.testing.assert_allclose(after[path], before[path] * (1 - 0.1 * 0.01 * factor), rtol=1e-6)
    np.testing.assert_array_equal(after["stem_bn/gamma"], before["stem_bn/gamma"])


def test_without_layer_decay_the_optimizer_has_no_factors():
    model = build_model("resnet_small", SHAPE, 3, seed=0)
    assert layer_rate_factors(model, "resnet_small", None) == ()
    assert make_optimizer("adam", 0.1).rate_factors == ()


@pytest.fixture(scope="module")
def convnext_and_vit():
    return {name: build_model(name, SHAPE, 3, seed=0) for name in ("convnext_tiny", "vit_small_patch16")}


def test_declared_exemptions_hold_for_layer_scales_position_table_and_attention_biases(convnext_and_vit):
    for name, model in convnext_and_vit.items():
        optimizer = make_optimizer("adamw", 0.1, weight_decay=0.5,
                                   decay_exempt_variables=decay_exempt(model, name))
        before = {v.path: v.numpy().copy() for v in model.trainable_variables}
        optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
        after = {v.path: v.numpy() for v in model.trainable_variables}
        kept = [path for path in before if np.array_equal(before[path], after[path])]
        if name == "convnext_tiny":
            # Layer scales are (1, 1, C, 1) depthwise kernels here: no shape rule would find them.
            scales = [path for path in before if path.endswith("_layer_scale/kernel")]
            assert len(scales) == 18 and set(scales) <= set(kept)
        else:
            # The position table is a Dense kernel of (1, tokens * width); the attention biases are (heads, size).
            assert "vit_position_embedding/kernel" in kept
            assert "vit_block0_attention/query/bias" in kept and before["vit_block0_attention/query/bias"].ndim == 2
        decayed = [path for path in before if path.endswith("/kernel") and path not in kept]
        assert decayed and all(np.allclose(after[p], before[p] * 0.95, rtol=1e-6) for p in decayed[:3])


def test_units_of_convnext_and_vit(convnext_and_vit):
    factors = {name: {v.path: f for v, f in layer_rate_factors(model, name, DECAY)}
               for name, model in convnext_and_vit.items()}
    convnext, vit = factors["convnext_tiny"], factors["vit_small_patch16"]
    assert convnext["convnext_tiny_stem_conv/kernel"] == DECAY ** 5
    assert convnext["convnext_tiny_stage_0_block_2_depthwise_conv/kernel"] == DECAY ** 4
    # The downsampling in front of stage 1 belongs to stage 1.
    assert convnext["convnext_tiny_downsampling_conv_0/kernel"] == DECAY ** 3
    assert convnext["convnext_tiny_stage_3_block_2_layer_scale/kernel"] == DECAY
    assert "convnext_tiny_layer_normalization_0/gamma" not in convnext and "head_dense/kernel" not in convnext
    assert vit["vit_patch_embedding/kernel"] == vit["vit_position_embedding/kernel"] == DECAY ** 13
    assert vit["vit_block0_attention/query/kernel"] == DECAY ** 12
    assert vit["vit_block11_mlp2/bias"] == DECAY
    assert "vit_norm/gamma" not in vit and "head_dense/bias" not in vit


def _numbered_layers_model(n_tags=2):
    """A model whose layers Keras numbered (as in a DeepDanbooru 1.0 file): no family places them."""
    inputs = keras.Input(SHAPE)
    x = keras.layers.Conv2D(3, 3, name="conv2d_7")(inputs)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Activation("sigmoid", name="output")(keras.layers.Dense(n_tags, name="dense_3")(x))
    return keras.Model(inputs, outputs, name="old_tagger")


def test_a_layer_no_family_places_is_refused_naming_the_network():
    model = _numbered_layers_model()
    with pytest.raises(ModelError, match="^layer_decay: cannot tell which stage or block of resnet_small layer "
                                         "'conv2d_7' belongs to; layer_decay knows the layers of the models "
                                         r"deepdanbooru builds and import-model imports \(ViT, EVA02, ConvNeXt, SwinV2\)$"):
        layer_rate_factors(model, "resnet_small", DECAY)
    with pytest.raises(ModelError, match="^project.json: layer_decay: cannot tell which stage or block of "
                                         "--source-model old.keras layer 'conv2d_7'"):
        layer_rate_factors(model, "resnet_small", DECAY, "project.json", network="--source-model old.keras")
    assert layer_rate_factors(model, "resnet_small", None) == ()


# --- networks import-model builds, whatever project.json's `model` row ---

TIMM = Path(__file__).resolve().parent / "fixtures" / "timm"
IMPORTED = sorted(p.name for p in TIMM.iterdir() if (p / "config.json").is_file())


@pytest.mark.parametrize("fixture", IMPORTED)
def test_every_imported_network_gets_rates_from_its_own_layers(fixture):
    from deepdanbooru.models.head import head_layer
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    model = import_checkpoint(TIMM / fixture).model
    # resnet_small's row places none of these layers: the network's own names decide.
    factors = {id(variable): factor for variable, factor in layer_rate_factors(model, "resnet_small", DECAY)}
    by_layer = [[factors.get(id(v)) for v in layer.trainable_weights] for layer in model.layers
                if layer.trainable_weights]
    first, *_ = by_layer
    depth = round(np.log(first[0]) / np.log(DECAY)) - 1  # L: the stem learns at DECAY ** (L + 1)
    assert depth == (2 if fixture.startswith(("vit", "eva02")) else 4)
    # In build order (input to output) a layer never learns slower than one before it; the head at the full rate.
    rates = [factor if factor is not None else 1.0 for layer in by_layer for factor in layer]
    assert rates == sorted(rates) and rates[0] == DECAY ** (depth + 1)
    assert set(rates) == {DECAY ** k for k in range(depth + 2)}
    assert all(id(v) not in factors for v in head_layer(model).trainable_weights)


def test_imported_wd_families_place_stem_stages_and_top():
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    def factors(fixture, name):
        model = import_checkpoint(TIMM / fixture).model
        return {v.path: f for v, f in layer_rate_factors(model, name, DECAY)}, \
            {v.path for v in decay_exempt(model, name) if v.name != "bias"}

    convnext, exempt = factors("convnext_wd", "convnext_tiny")
    assert convnext["convnext_base_stem_conv/kernel"] == DECAY ** 5
    assert convnext["convnext_base_stage_0_block_0_depthwise_conv/kernel"] == DECAY ** 4
    assert convnext["convnext_base_downsampling_conv_0/kernel"] == DECAY ** 3
    assert convnext["convnext_base_stage_3_block_0_pointwise_conv_2/kernel"] == DECAY
    assert "convnext_base_head_layernorm/gamma" not in convnext and "head_dense/kernel" not in convnext
    assert "convnext_base_stage_3_block_0_layer_scale/kernel" in exempt
    swin, exempt = factors("swinv2_wd", "vit_small_patch16")
    assert swin["swin_patch_embedding/kernel"] == swin["swin_patch_norm/gamma"] == DECAY ** 5
    assert swin["swin_stage0_block1_q/kernel"] == DECAY ** 4
    # The patch merging in front of stage 1 belongs to stage 1.
    assert swin["swin_merge1_reduction/kernel"] == DECAY ** 3
    assert swin["swin_stage3_block0_mlp2/kernel"] == DECAY
    assert "swin_norm/gamma" not in swin and "head_dense/kernel" not in swin
    assert {"swin_stage0_block0_scale/kernel", "swin_stage0_block0_position_bias/kernel"} <= exempt
    assert not any("mlp1" in path or "_q/" in path for path in exempt)
    vit, exempt = factors("vit_registers_layerscale", "convnext_tiny")
    assert vit["vit_class_token/kernel"] == vit["vit_register_tokens/kernel"] == vit["vit_patch_embedding/kernel"] \
        == DECAY ** 3
    assert vit["vit_block1_mlp2/kernel"] == DECAY
    assert {path for path in exempt if "norm" not in path} == {
        "vit_class_token/kernel", "vit_register_tokens/kernel", "vit_position_embedding/kernel"}


LATER_EXPORTS = ["model-resnet_small.e2.keras", "model-resnet_small.keras"]


@pytest.mark.slow
def test_layer_decay_resumes_exactly(tmp_path, sample_dataset):
    from deepdanbooru.training.loop import SliceTrainer
    from deepdanbooru.training.strategy import choose_strategy
    from deepdanbooru.training.train import plan_training, train_project

    reference = make_project(tmp_path / "reference", *sample_dataset, optimizer="adamw", layer_decay=0.6,
                             learning_rate=0.01, lr_schedule="warmup_cosine", warmup_epochs=0.5)
    train_project(reference, echo=lambda line: None)
    assert (read_state(reference)["used_epoch"], read_state(reference)["used_minibatch"]) == (2, 12)
    # Killed after the first slice of epoch 2 (ckpt-4).
    project = killed_copy(reference, tmp_path / "resumed", "ckpt-4", LATER_EXPORTS)
    train_project(project, echo=lambda line: None)
    for name in LATER_EXPORTS:
        assert_same_weights(reference / name, project / name)
    # The run did train with the per-stage rates: the trainer's optimizer holds them.
    plan = plan_training(project)
    trainer = SliceTrainer(plan, choose_strategy(plan.devices, plan.role), [], lambda line: None)
    inner = getattr(trainer.optimizer, "inner_optimizer", trainer.optimizer)
    factors = {v.path: f for v, f in inner.rate_factors}
    assert factors["stem_conv/kernel"] == pytest.approx(0.6 ** 5) and "head_conv/kernel" not in factors


def _files(directory: Path) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None for p in directory.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("fixture, size, row", [("vit_wd", 32, "convnext_tiny"),
                                                ("convnext_wd", 32, "vit_small_patch16"),
                                                ("swinv2_wd", 48, "vit_small_patch16"),
                                                ("eva02_wd", 32, "convnext_tiny")])
def test_fine_tuning_an_imported_tagger_with_layer_decay(tmp_path, sample_dataset, fixture, size, row):
    from click.testing import CliRunner

    from deepdanbooru.cli import main
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    # One Adam step (24 posts, batch 24): each weight moves by rate * factor * g / (|g| + epsilon), so the
    # largest move in a layer is its learning rate. rating:general keeps the source's `general` row: the rows of
    # new tags start with a zero kernel, through which no gradient would reach the trunk in the first step.
    database, tags = sample_dataset
    project = make_project(tmp_path / "p", database, [*tags, "rating:general"], model=row, image_width=size,
                           image_height=size, epoch_count=1, minibatch_size=24, optimizer="adam", learning_rate=0.01,
                           layer_decay=DECAY)
    result = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(TIMM / fixture)])
    assert result.exit_code == 0, result.output
    assert read_state(project)["used_minibatch"] == 1
    before = import_checkpoint(TIMM / fixture).model
    # Named after the network that trained, not project.json's row.
    after = keras.models.load_model(project / f"model-{before.name}.keras", compile=False)
    assert not list(project.glob(f"model-{row}*"))
    rates = {}
    for layer in before.layers:
        if layer.trainable_weights and layer.name != "head_dense":
            pairs = zip(after.get_layer(layer.name).get_weights(), layer.get_weights())
            moved = [np.abs(a - b).max() for a, b in pairs]
            rates[layer.name] = max(moved) / 0.01
    stem, first, last, top = {
        "vit_wd": ("vit_patch_embedding", "vit_block0_mlp1", "vit_block1_mlp1", "vit_norm"),
        "convnext_wd": ("convnext_base_stem_conv", "convnext_base_stage_0_block_0_pointwise_conv_1",
                        "convnext_base_stage_3_block_0_pointwise_conv_1", "convnext_base_head_layernorm"),
        "swinv2_wd": ("swin_patch_embedding", "swin_stage0_block0_mlp1", "swin_stage3_block0_mlp1", "swin_norm"),
        "eva02_wd": ("vit_patch_embedding", "vit_block0_mlp_gate", "vit_block1_attn_q", "vit_fc_norm"),
    }[fixture]
    depth = 2 if fixture in ("vit_wd", "eva02_wd") else 4
    assert rates[stem] == pytest.approx(DECAY ** (depth + 1), rel=1e-2)
    assert rates[first] == pytest.approx(DECAY ** depth, rel=1e-2)
    assert rates[last] == pytest.approx(DECAY, rel=1e-2)
    assert rates[top] == pytest.approx(1.0, rel=1e-2)
    # Every layer learns at a power of DECAY, and build order is depth order: a deeper layer never learns slower.
    # A layer whose gradients are all tiny (SwinV2's position biases) moves less than its rate, as Adam's
    # epsilon weighs in next to |g|: the power is the one just above the move.
    powers = [int(np.floor(np.log(rate) / np.log(DECAY) + 0.01)) for rate in rates.values()]
    assert powers == sorted(powers, reverse=True) and set(powers) == set(range(depth + 2))


def test_a_refused_source_writes_nothing_into_the_project(tmp_path, sample_dataset):
    from click.testing import CliRunner

    from deepdanbooru.cli import main
    from deepdanbooru.models.files import save_atomic
    from deepdanbooru.models.timm.source import categories_json

    database, tags = sample_dataset
    project = make_project(tmp_path / "p", database, tags, layer_decay=DECAY)
    source = tmp_path / "old.keras"
    save_atomic(_numbered_layers_model(len(tags)), source, tags)
    # With categories beside the source, the run would write the project's categories.json.
    (tmp_path / "old.categories.json").write_text(json.dumps(categories_json([0] * len(tags))))
    before = _files(project)
    result = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(source)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1] == (
        f"error: {project / 'project.json'}: layer_decay: cannot tell which stage or block of --source-model "
        "old.keras (old_tagger) layer 'conv2d_7' belongs to; layer_decay knows the layers of the models "
        "deepdanbooru builds and import-model imports (ViT, EVA02, ConvNeXt, SwinV2)")
    assert _files(project) == before
