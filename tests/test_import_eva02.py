"""import-model on timm's EVA02 (wd-eva02-large-tagger-v3's architecture): what the shared importer tests in
test_import_timm.py do not cover (the real WD config, the rotary tables, another input size, refused options).

The fixtures under tests/fixtures/timm/eva02_* were made by make_fixtures.py there with timm and torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "timm"
TOLERANCE = 1e-4
# wd-eva02-large-tagger-v3's config.json as published (SmilingWolf/wd-eva02-large-tagger-v3, 634 bytes).
WD_EVA02_CONFIG = {
    "architecture": "eva02_large_patch14_448", "num_classes": 10861, "num_features": 1024, "global_pool": "avg",
    "model_args": {"img_size": 448, "ref_feat_shape": [32, 32]},
    "pretrained_cfg": {"custom_load": False, "input_size": [3, 448, 448], "fixed_input_size": False,
                       "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center", "mean": [0.5, 0.5, 0.5],
                       "std": [0.5, 0.5, 0.5], "num_classes": 10861, "pool_size": None, "first_conv": None,
                       "classifier": None}}
# timm 1.0.31: create_model("eva02_large_patch14_448", num_classes=10861, img_size=448, ref_feat_shape=[32, 32])
# has 464 state-dict tensors, 315,187,757 values, and this digest of its sorted "name:[shape]" lines.
TIMM_STATE = (464, 315_187_757, "6cc5bed80158bad68de07a30d8fabc72602151a3c1e677cfb49607308e394a4d")


def scores(logits):
    return 1.0 / (1.0 + np.exp(-np.load(logits).astype(np.float64)))


def _wd_options(tmp_path):
    from deepdanbooru.models.timm import eva02
    from deepdanbooru.models.timm.source import read_source

    folder = tmp_path / "wd-eva02-large-tagger-v3"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(WD_EVA02_CONFIG))
    (folder / "model.safetensors").write_bytes(b"")
    source = read_source(folder)
    return source, eva02.options(source.architecture, source.model_args, source.num_classes, source.config_path)


def test_the_published_wd_config_builds_timms_network(tmp_path):
    from deepdanbooru.models.timm import eva02
    from deepdanbooru.models.timm.checkpoint import family_of

    source, opts = _wd_options(tmp_path)
    assert family_of(source) is eva02 and source.input_size == (448, 448)
    assert (opts.width, opts.depth, opts.heads, opts.hidden, opts.patch, opts.grid) == (1024, 24, 16, 2730, 14,
                                                                                        (32, 32))
    assert (opts.qkv_fused, opts.mlp, opts.scale_mlp, opts.class_token, opts.abs_pos) == (False, "swiglu", True,
                                                                                         True, True)
    assert (opts.pool, opts.norm, opts.fc_norm, opts.ref_feat_shape) == ("avg", False, True, (32, 32))
    # The tensors the importer asks the file for are timm's state dict, name for name and shape for shape.
    expected = eva02.expected_tensors(opts)
    digest = hashlib.sha256("\n".join(f"{name}:{list(expected[name])}" for name in sorted(expected)).encode())
    assert (len(expected), sum(int(np.prod(shape)) for shape in expected.values()), digest.hexdigest()) == TIMM_STATE


def test_the_wd_fixture_reads_as_the_published_config_does():
    from deepdanbooru.models.timm.source import read_source

    config = json.loads((FIXTURES / "eva02_wd" / "config.json").read_text())
    shrunk = {"embed_dim", "depth", "num_heads", "patch_size"}
    assert config["architecture"] == WD_EVA02_CONFIG["architecture"] and config["global_pool"] == "avg"
    assert set(config["model_args"]) - shrunk == set(WD_EVA02_CONFIG["model_args"])
    source = read_source(FIXTURES / "eva02_wd")
    # ref_feat_shape is the token grid, as 32 is 448 / 14; a WD tagger: BGR, mean and std 0.5.
    assert config["model_args"]["ref_feat_shape"] == [32 // 8] * 2 and source.input_size == (32, 32)
    assert (source.channel_order, source.mean, source.std) == ("bgr", (0.5,) * 3, (0.5,) * 3)


@pytest.mark.parametrize("change", [
    {"rope_indexing": "ij"}, {"rope_half": False}, {"rope_temperature": 10000.0}, {"rope_offset": 0.0},
    {"ref_feat_shape": None}])
def test_every_rotary_option_changes_what_the_model_computes(change):
    from deepdanbooru.models.timm import eva02
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    folder = FIXTURES / "eva02_fused"
    imported = import_checkpoint(folder)
    model, inputs = imported.model, np.load(folder / "inputs.npy")
    opts = eva02.options(imported.source.architecture, imported.source.model_args, 7, folder / "config.json")
    assert np.abs(np.asarray(model(inputs)) - scores(folder / "logits.npy")).max() < TOLERANCE
    other = replace(opts, **change)
    sin, cos = eva02.rope_tables(other)
    model.get_layer("vit_rope_sin").set_weights([sin.reshape(1, -1)])
    model.get_layer("vit_rope_cos").set_weights([cos.reshape(1, -1)])
    model.get_layer("vit_rope_rotate").set_weights([eva02.rotation(other)])
    assert np.abs(np.asarray(model(inputs)) - scores(folder / "logits.npy")).max() > 1e-3


@pytest.mark.parametrize("name, tokens", [("eva02_wd", 1 + 4 * 4), ("eva02_registers", 2 + 6 * 5),
                                          ("eva02_fused", 1 + 4 * 6)])
def test_every_value_of_the_file_is_one_trainable_parameter(name, tokens):
    from deepdanbooru.models.builder import count_weights
    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.models.timm.safetensors import read_header

    header, _ = read_header(FIXTURES / name / "model.safetensors")
    # Layer scales (gamma_1, gamma_2) are folded into the projections before them, as the ViT importer does.
    stored = sum(int(np.prod(info.shape)) for key, info in header.items() if ".gamma_" not in key)
    trainable, constants = count_weights(import_checkpoint(FIXTURES / name).model)
    assert trainable == stored
    # The constants: sin and cos for every token's 8 head dimensions, and the 8x8 rotation.
    assert constants == 2 * tokens * 8 + 8 * 8


def test_rotary_tables_are_constants_and_prefix_tokens_stay_unrotated():
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    model = import_checkpoint(FIXTURES / "eva02_wd").model
    trainable = {v.path.split("/")[0] for v in model.trainable_variables}
    assert not trainable & {"vit_rope_sin", "vit_rope_cos", "vit_rope_rotate"}
    sin, cos = (model.get_layer(f"vit_rope_{part}").get_weights()[0].reshape(17, 8) for part in ("sin", "cos"))
    # Row 0 is the class token; the first patch sits at (0, 0), where every angle is 0.
    np.testing.assert_array_equal(sin[:2], 0.0)
    np.testing.assert_array_equal(cos[:2], 1.0)
    np.testing.assert_allclose(sin ** 2 + cos ** 2, 1.0, atol=1e-6)


def test_another_input_size_matches_timm_at_that_size():
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    # No position table here, so timm's answer at 28x32 is exact: the rotary tables are recomputed for the 8x7
    # grid with ref_feat_shape kept, as timm's set_input_size does.
    folder = FIXTURES / "eva02_registers"
    imported = import_checkpoint(folder, input_size=(32, 28))
    assert imported.input_size == (32, 28) and imported.model.input_shape[1:] == (32, 28, 3)
    got = np.asarray(imported.model(np.load(folder / "inputs_resized.npy")), dtype=np.float64)
    assert np.abs(got - scores(folder / "logits_resized.npy")).max() < TOLERANCE
    # With a position table (the WD layout) it is resampled as a ViT's is.
    wd = import_checkpoint(FIXTURES / "eva02_wd", input_size=(48, 40)).model
    assert np.isfinite(np.asarray(wd(np.zeros((1, 48, 40, 3), np.float32)))).all()


def test_the_network_round_trips_through_its_json():
    import keras

    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    # A resumed fine-tune rebuilds the network from model.to_json() (training.network).
    folder = FIXTURES / "eva02_fused"
    model = import_checkpoint(folder).model
    again = keras.models.model_from_json(model.to_json())
    again.set_weights(model.get_weights())
    inputs = np.load(folder / "inputs.npy")
    np.testing.assert_allclose(np.asarray(again(inputs)), np.asarray(model(inputs)), atol=1e-6)


def test_built_in_layers_only_and_a_mixed_precision_step():
    import keras
    import tensorflow as tf

    from deepdanbooru.models.precision import MIXED, with_policy
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    folder = FIXTURES / "eva02_wd"
    model = import_checkpoint(folder).model
    for layer in model.layers:
        assert getattr(keras.layers, type(layer).__name__, None) is type(layer), (layer.name, type(layer))
    # As a --source-model trains under mixed_float16: float16 attention and tables, float32 scores, finite gradients.
    mixed = with_policy(model, MIXED)
    assert mixed.get_layer("vit_block0_attn_q").compute_dtype == "float16"
    inputs = np.load(folder / "inputs.npy")
    with tf.GradientTape() as tape:
        scores = mixed(inputs, training=True)
        loss = tf.reduce_mean(scores)
    gradients = tape.gradient(loss, mixed.trainable_variables)
    assert scores.dtype == tf.float32 and np.abs(scores.numpy() - np.asarray(model(inputs))).max() < 1e-2
    assert all(g is not None and np.isfinite(keras.ops.convert_to_numpy(g)).all() for g in gradients)


@pytest.mark.slow
def test_converts_to_onnx_as_export_bundle_needs():
    from deepdanbooru.inference.onnx_graph import onnx_available, run_onnx, to_onnx
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    if not onnx_available():
        pytest.skip("tf2onnx and onnxruntime are not installed")
    folder = FIXTURES / "eva02_wd"
    inputs = np.load(folder / "inputs.npy")
    onnx = run_onnx(to_onnx(import_checkpoint(folder).model), inputs)
    assert np.abs(onnx - scores(folder / "logits.npy")).max() < TOLERANCE


def _set(**args):
    return lambda config: config["model_args"].update(args)


BAD = {
    "rope type": (_set(rope_type="mixed"), r'model_args.rope_type: "mixed" is not supported \(only "cat"\W' ),
    "rope attention": (_set(attn_type="rope"), r'model_args.attn_type: "rope" is not supported \(only "eva"\W' ),
    "no rotary embedding": (_set(use_rot_pos_emb=False), r"model_args.use_rot_pos_emb: false is not supported "
                                                         r"\(only true"),
    "qk norm": (_set(qk_norm=True), r"model_args.qk_norm: true is not supported \(only false, timm's default\)"),
    "post-norm blocks": (_set(use_post_norm=True), r"model_args.use_post_norm: true is not supported"),
    "token pool without class token": (_set(class_token=False, global_pool="token"),
                                       r"model_args.global_pool: token pooling needs class_token true"),
    "map pool": (_set(global_pool="map"), r"model_args.global_pool: 'map' is not supported \(supported: avg, token\)"),
    "unknown argument": (_set(mystery=1), r"model_args.mystery: is not supported for eva02_large_patch14_448"),
    "heads": (_set(num_heads=5), r"model_args.num_heads: 5 must divide embed_dim 32"),
    "other size name": (lambda config: config.update(architecture="eva02_huge_patch14_448"),
                        r"architecture: 'eva02_huge_patch14_448' is not an EVA02 \(eva02_\{tiny,small,base,large\}"
                        r"_patch<P>_<size>\)$"),
    "no class token in the file": (_set(class_token=False),
                                   r"model.safetensors: 1 tensor\(s\) the architecture does not have .*: cls_token$"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_unsupported_eva02_gets_one_line_and_nothing_written(case, tmp_path):
    change, message = BAD[case]
    folder = Path(shutil.copytree(FIXTURES / "eva02_wd", tmp_path / "eva02"))
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["import-model", str(folder), "--save-path", str(out / "m.keras")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and re.search(message, lines[0]), result.output
    assert list(out.iterdir()) == []


def test_backbone_weights_refuses_an_eva02_folder_in_one_line():
    from deepdanbooru.errors import ModelError
    from deepdanbooru.models.backbone import load_backbone_weights
    from deepdanbooru.models.builder import build_model

    # No registry row is an EVA02: the folder starts a fine-tune whole, as --source-model.
    model = build_model("vit_small_patch16", (32, 32, 3), 5)
    with pytest.raises(ModelError, match=r"eva02_wd/config.json: architecture: the eva02_large_patch14_448 checkpoint "
                                         r"has no model in the registry to start .*import-model takes it whole"):
        load_backbone_weights(model, "vit_small_patch16", FIXTURES / "eva02_wd", (32, 32, 3))


@pytest.mark.slow
def test_trains_under_xla_with_its_last_block_only():
    """An imported EVA02 meets jit_compile and trainable_blocks: the compiled training step takes it without a
    fallback (rotary tables, einsum attention), the compiled forward pass gives the plain one's scores, and
    with trainable_blocks 1 the first block and the stem stay bit for bit."""
    import tensorflow as tf

    from deepdanbooru.compiling import XlaFunction
    from deepdanbooru.models import make_optimizer
    from deepdanbooru.models.partial import partial_training
    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.training.step import TrainStep

    folder = FIXTURES / "eva02_wd"
    model = import_checkpoint(folder).model
    inputs = tf.constant(np.load(folder / "inputs.npy"))
    notices = []
    forward = XlaFunction(lambda x: model(x, training=False), [tf.TensorSpec([None, *inputs.shape[1:]])], True,
                          "the forward pass", notices.append)
    np.testing.assert_allclose(forward(inputs).numpy(), np.asarray(model(inputs)), atol=1e-5)
    strategy = tf.distribute.get_strategy()
    partial = partial_training(model, "vit_small_patch16", 1)
    partial.freeze()
    optimizer = make_optimizer("adam", 0.01)
    optimizer.build(model.trainable_variables)
    frozen = [(weight.path, weight.numpy()) for layer in partial.frozen for weight in layer.weights]
    assert any(path.startswith("vit_block0_") for path, _ in frozen)
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, jit_compile=True,
                     echo=notices.append)
    labels = tf.constant((np.random.default_rng(0).random((len(inputs), model.output_shape[-1])) < 0.5)
                         .astype(np.float32))
    batch = {"image": inputs, "label": labels}
    step.bind({key: tf.TensorSpec([None, *value.shape[1:]], value.dtype) for key, value in batch.items()})
    step(batch)
    assert notices == [] and step.jit_compile
    by_path = {weight.path: weight.numpy() for weight in model.weights}
    for path, before in frozen:
        np.testing.assert_array_equal(by_path[path], before, err_msg=path)
