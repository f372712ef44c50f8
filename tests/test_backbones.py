"""The ConvNeXt, EfficientNetV2 and ViT rows; backbone_weights and freeze_backbone_epochs."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from click.testing import CliRunner
from train_helpers import assert_same_weights, cli_env, make_project, set_config

from deepdanbooru.cli import main
from deepdanbooru.errors import ConfigError, ModelError
from deepdanbooru.models import build_model, check_model_input, count_weights, parameter_counts
from deepdanbooru.project.config import load_config

# One small member of each family: the '_small' / '_s' rows are checked through their counts only.
# The ViT is not square so its position embedding and grad-cam grid are seen to follow both sides.
FAMILIES = {"convnext_tiny": (32, 32, 3), "efficientnetv2_b0": (32, 32, 3), "vit_small_patch16": (32, 48, 3)}

# (trainable, non_trainable) at 224x224 with 1000 tags: the published ImageNet-1k counts of ConvNeXt-T/S,
# EfficientNetV2-B0/S, and ViT-S/16 less its class token and that token's position (2 x 384).
REFERENCE_COUNTS = {
    "convnext_tiny": (28_589_128, 0),
    "convnext_small": (50_223_688, 0),
    "efficientnetv2_b0": (7_139_704, 60_608),
    "efficientnetv2_s": (21_458_488, 153_872),
    "vit_small_patch16": (22_049_896, 0),
}


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.mark.parametrize("name", sorted(REFERENCE_COUNTS))
def test_counts_at_the_reference_size(name):
    assert parameter_counts(name, (224, 224, 3), 1000) == REFERENCE_COUNTS[name]


def test_vit_position_embedding_follows_the_input_size():
    small = parameter_counts("vit_small_patch16", (32, 32, 3), 10)[0]
    assert parameter_counts("vit_small_patch16", (32, 64, 3), 10)[0] - small == 4 * 384  # 2x4 tokens, not 2x2
    assert parameter_counts("convnext_tiny", (32, 64, 3), 10) == parameter_counts("convnext_tiny", (64, 32, 3), 10)


def test_input_sizes_the_new_rows_refuse():
    check_model_input("vit_small_patch16", (32, 48, 3))
    with pytest.raises(ModelError, match=r"p/project.json: image_width/image_height: vit_small_patch16 cuts the "
                                         r"image into 16x16 patches: .* multiples of 16, got 32x40"):
        check_model_input("vit_small_patch16", (32, 40, 3), source="p/project.json")
    with pytest.raises(ModelError, match=r"convnext_tiny needs an input of at least 32x32 \(keras.applications' "
                                         r"ConvNeXtTiny takes nothing smaller\)"):
        check_model_input("convnext_tiny", (31, 64, 3))
    check_model_input("efficientnetv2_s", (32, 33, 3))


def test_counts_need_no_tensorflow():
    code = ("import sys; from deepdanbooru.models.table import parameter_counts as p; "
            "print(p('efficientnetv2_s', (64, 64, 3), 5), p('vit_small_patch16', (32, 32, 3), 5)); "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env())
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.fixture(scope="module")
def built():
    return {name: build_model(name, shape, 5, seed=3) for name, shape in FAMILIES.items()}


@pytest.mark.slow
def test_builds_equal_their_counts_and_hold_only_built_in_layers(built):
    for name, model in built.items():
        assert count_weights(model) == parameter_counts(name, FAMILIES[name], 5), name
        assert model.input_shape == (None, *FAMILIES[name]) and model.output_shape == (None, 5)
        assert [layer.name for layer in model.layers][-3:] == ["head_pool", "head_dense", "output"]
        assert model.get_layer("output").dtype_policy.name == "float32"
        for layer in model.layers:
            assert getattr(keras.layers, type(layer).__name__, None) is type(layer), (name, layer.name, type(layer))
            # Stable names: none left as Keras numbered them (that depends on what the process built before).
            assert not layer.name.startswith(("add_", "layer_normalization", "input_layer")), layer.name
    # ConvNeXt's LayerScale is a 1x1 depthwise conv starting at the application's 1e-6.
    scale = built["convnext_tiny"].get_layer("convnext_tiny_stage_0_block_0_layer_scale")
    assert isinstance(scale, keras.layers.DepthwiseConv2D)
    np.testing.assert_array_equal(scale.get_weights()[0], np.full((1, 1, 96, 1), 1e-6, np.float32))
    # The application's preprocessing, folded for [0, 1] input: ImageNet mean and deviation.
    image = np.full((1, 32, 32, 3), 0.485, np.float32)
    assert abs(float(built["efficientnetv2_b0"].get_layer("preprocess")(image)[0, 0, 0, 0])) < 1e-6


@pytest.mark.slow
def test_initial_weights_are_a_function_of_the_seed_alone(built):
    keras.utils.set_random_seed(99)  # global state must not matter
    again = build_model("vit_small_patch16", FAMILIES["vit_small_patch16"], 5, seed=3)
    for a, b in zip(built["vit_small_patch16"].weights, again.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    attention = again.get_layer("vit_block0_attention")
    query, key = (keras.ops.convert_to_numpy(attention.query_dense.kernel),
                  keras.ops.convert_to_numpy(attention.key_dense.kernel))
    assert not np.array_equal(query, key)


_PLAIN = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np
    out = {}
    for path in sys.argv[2:]:
        model = keras.models.load_model(path)
        x = np.load(sys.argv[1])[:, :model.input_shape[1], :model.input_shape[2]]
        out[path] = keras.ops.convert_to_numpy(model(x)).tolist()
    assert "deepdanbooru" not in sys.modules
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, sample_dataset):
    """Each family trained for 6 steps by train-project at its tiny size: {name: project}.

    The ViT trains under MirroredStrategy over two logical CPUs, for its op nodes and attention; ConvNeXt
    and EfficientNetV2 hold only layer kinds (batch norm to synchronize included) the ResNets' mirrored
    tests cover."""
    from deepdanbooru.training.train import train_project

    projects = {}
    for name, (height, width, _) in FAMILIES.items():
        project = make_project(tmp_path_factory.mktemp(name) / "project", *sample_dataset, model=name,
                               image_height=height, image_width=width, epoch_count=1, checkpoint_frequency_mb=6)
        if name == "vit_small_patch16":
            result = subprocess.run([sys.executable, "-m", "deepdanbooru", "train-project", str(project)],
                                    capture_output=True, text=True,
                                    env=dict(cli_env(), DEEPDANBOORU_LOGICAL_CPUS="2"))
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
            assert "Devices: MirroredStrategy: 2 replicas (CPU:0, CPU:1)" in result.stdout
            assert "Training complete: 1 epoch(s), 6 steps, 24 samples" in result.stdout
        else:
            train_project(project, echo=lambda *_: None)
        projects[name] = project
    return projects


@pytest.mark.slow
def test_each_family_trains_exports_and_opens_in_plain_keras(trained, tmp_path):
    x = np.random.default_rng(0).uniform(size=(2, 32, 48, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    paths = [str(project / f"model-{name}.keras") for name, project in trained.items()]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, "-c", _PLAIN, str(tmp_path / "x.npy"), *paths],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = json.loads(result.stdout.strip().splitlines()[-1])
    from deepdanbooru.inference.gradcam import feature_tensor

    grids = {"convnext_tiny": (1, 1, 768), "efficientnetv2_b0": (1, 1, 1280), "vit_small_patch16": (2, 3, 384)}
    for name, project in trained.items():
        model = keras.models.load_model(project / f"model-{name}.keras")
        assert tuple(feature_tensor(model).shape[1:]) == grids[name]
        expected = keras.ops.convert_to_numpy(model(x[:, :model.input_shape[1], :model.input_shape[2]]))
        np.testing.assert_allclose(plain[str(project / f"model-{name}.keras")], expected, atol=1e-6)
        fresh = build_model(name, FAMILIES[name], model.output_shape[-1], seed=0)
        # It trained: the head moved away from its initial weights.
        assert np.abs(model.get_layer("head_dense").get_weights()[0]
                      - fresh.get_layer("head_dense").get_weights()[0]).max() > 1e-4


@pytest.mark.slow
def test_vit_converts_to_onnx(trained, tmp_path):
    """Exact GELU (erfc, which ONNX lacks; ConvNeXt's too), the ViT's op nodes and attention. The other
    conversions passed when the rows were added and are not repeated in CI: TFLite takes every TensorFlow op
    these use, ConvNeXt's depthwise convs and EfficientNetV2's layers are standard ONNX ops."""
    name = "vit_small_patch16"
    from deepdanbooru.inference.onnx_graph import onnx_available

    if not onnx_available():
        pytest.skip("tf2onnx and onnxruntime are not installed")
    output = tmp_path / f"{name}.onnx"
    result = run_cli("conv2tflite", "--project-path", trained[name], "--save-path", output)
    assert result.exit_code == 0, (name, result.output)
    assert "Largest absolute difference from Keras on 8 sample inputs" in result.output
    assert output.stat().st_size > 1_000_000


@pytest.mark.slow
def test_grad_cam_on_the_vit(trained, tmp_path, sample_dataset):
    """The ViT's token grid is laid out as a feature map; the convolutional families' maps are checked
    beside the plain-Keras load and go through grad-cam like the ResNets'."""
    database, _ = sample_dataset
    image = sorted((database.parent / "images").rglob("*.jpg"))[0]
    project = trained["vit_small_patch16"]
    result = run_cli("grad-cam", project, image, tmp_path, "--threshold", "0")
    assert result.exit_code == 0, result.output
    tags = len((project / "tags.txt").read_text().split())
    assert len(list(tmp_path.rglob("*.gradcam.png"))) == tags


@pytest.mark.slow
def test_each_family_builds_and_steps_under_mixed_precision():
    import tensorflow as tf

    from deepdanbooru.models.precision import MIXED, global_policy, with_policy

    x = np.random.default_rng(1).uniform(size=(2, 32, 48, 3)).astype(np.float32)
    # 32x48: at 32x32 EfficientNetV2's last batch norms see 1x1 maps of 2 images, whose float16
    # gradients overflow without the loss scaling training applies.
    for name in FAMILIES:
        shape = (32, 48, 3)
        with global_policy(MIXED):
            model = build_model(name, shape, 5, seed=0)
        assert model.get_layer("head_dense").compute_dtype == "float16"
        assert model.get_layer("output").compute_dtype == "float32"
        images = x[:, :shape[0], :shape[1]]
        with tf.GradientTape() as tape:
            scores = model(images, training=True)
            loss = tf.reduce_mean(keras.losses.binary_crossentropy(np.ones((2, 5), np.float32), scores))
        gradients = tape.gradient(loss, model.trainable_variables)
        assert scores.dtype == tf.float32 and np.isfinite(scores.numpy()).all()
        assert all(g is not None and np.isfinite(keras.ops.convert_to_numpy(g)).all() for g in gradients)
        copy = with_policy(model, "float32")
        np.testing.assert_allclose(copy(images, training=False), model(images, training=False), atol=2e-2)


# --- backbone_weights and freeze_backbone_epochs ---


def test_new_keys_default_validate_and_resolve(tmp_path):
    (tmp_path / "project.json").write_text("{}")
    config = load_config(tmp_path)
    assert config.backbone_weights is None and config.freeze_backbone_epochs == 0
    (tmp_path / "project.json").write_text(json.dumps({"backbone_weights": "w/trunk.weights.h5",
                                                       "freeze_backbone_epochs": 2}))
    config = load_config(tmp_path)
    assert config.backbone_weights == tmp_path / "w" / "trunk.weights.h5" and config.freeze_backbone_epochs == 2
    with pytest.raises(ConfigError, match=r"project.json: backbone_weights: file not found: .*trunk.weights.h5"):
        config.require_backbone_weights()
    for raw, message in (({"backbone_weights": 3}, "backbone_weights: must be a string path or null"),
                         ({"freeze_backbone_epochs": -1}, "freeze_backbone_epochs: must be >= 0"),
                         ({"freeze_backbone_epochs": 1.5}, "freeze_backbone_epochs: must be an integer")):
        (tmp_path / "project.json").write_text(json.dumps(raw))
        with pytest.raises(ConfigError, match=message):
            load_config(tmp_path)


@pytest.mark.slow
def test_application_weights_file_loads_into_the_trunk(tmp_path):
    from deepdanbooru.models.backbone import load_backbone_weights
    from deepdanbooru.models.head import trunk_layers

    # What a user has: the keras.applications model's weights (here random, at another input size,
    # with the application's own preprocessing on).
    application = keras.applications.EfficientNetV2B0(include_top=False, weights=None, input_shape=(64, 64, 3))
    path = tmp_path / "b0_notop.weights.h5"
    application.save_weights(path)
    model = build_model("efficientnetv2_b0", (32, 32, 3), 4, seed=0)
    fresh_head = model.get_layer("head_dense").get_weights()
    assert load_backbone_weights(model, "efficientnetv2_b0", path, (32, 32, 3)) > 100
    for layer in application.layers:
        if layer.weights:
            for ours, theirs in zip(model.get_layer(layer.name).get_weights(), layer.get_weights()):
                np.testing.assert_array_equal(ours, theirs)
    for ours, fresh in zip(model.get_layer("head_dense").get_weights(), fresh_head):
        np.testing.assert_array_equal(ours, fresh)
    assert len(trunk_layers(model)) == \
        sum(1 for layer in application.layers if layer.weights)
    _assert_same_trunk_output(model, "top_activation", keras.applications.EfficientNetV2B0, path)


def _assert_same_trunk_output(model, last, application, path):
    """Our trunk on [0, 1] computes what the application, its own preprocessing on, computes on [0, 255]."""
    reference = application(include_top=False, weights=None, input_shape=model.input_shape[1:],
                            include_preprocessing=True)
    reference.load_weights(path)
    ours = keras.Model(model.input, model.get_layer(last).output)
    x = np.random.default_rng(0).uniform(size=(2, *model.input_shape[1:])).astype(np.float32)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours(x)), keras.ops.convert_to_numpy(reference(x * 255)),
                               atol=5e-5)


@pytest.mark.slow
def test_convnext_from_a_legacy_h5_like_the_imagenet_notop_files(tmp_path):
    """The application's LayerScale and grouped convs land in our depthwise layers; its output is ours."""
    from deepdanbooru.models.backbone import load_backbone_weights

    path = tmp_path / "convnext_tiny_notop.h5"
    # Keras 3 still writes the legacy whole-model .h5; its weights are read like a `_notop.h5`.
    keras.applications.ConvNeXtTiny(include_top=False, weights=None, input_shape=(32, 32, 3)).save(path)
    model = build_model("convnext_tiny", (32, 32, 3), 4, seed=0)
    assert load_backbone_weights(model, "convnext_tiny", path, (32, 32, 3)) == 99
    _assert_same_trunk_output(model, "convnext_tiny_layer_normalization_0", keras.applications.ConvNeXtTiny, path)


def test_mismatching_weights_name_the_file_and_the_first_layer(tmp_path):
    from deepdanbooru.models.backbone import build_trunk, load_backbone_weights

    model = build_model("resnet_small", (32, 32, 3), 3, seed=0)
    inputs = keras.Input((32, 32, 3))
    other = keras.Model(inputs, keras.layers.Conv2D(8, 7, use_bias=False, name="stem_conv")(inputs))
    path = tmp_path / "other.keras"
    other.save(path)
    with pytest.raises(ModelError) as caught:
        load_backbone_weights(model, "resnet_small", path, (32, 32, 3))
    assert str(caught.value) == (f"{path}: does not fit resnet_small's trunk: first difference at layer 'stem_conv' "
                                 "((7, 7, 3, 16)), the file has 'stem_conv' ((7, 7, 3, 8))")
    # A .keras model of the architecture trained on other tags: its trunk, our fresh head.
    donor = build_model("resnet_small", (32, 32, 3), 7, seed=9)
    donor.save(tmp_path / "donor.keras")
    fresh_head = model.get_layer("head_conv").get_weights()[0]
    load_backbone_weights(model, "resnet_small", tmp_path / "donor.keras", (32, 32, 3))
    np.testing.assert_array_equal(model.get_layer("stage4_block1_3_conv").get_weights()[0],
                                  donor.get_layer("stage4_block1_3_conv").get_weights()[0])
    np.testing.assert_array_equal(model.get_layer("head_conv").get_weights()[0], fresh_head)
    trunk = tmp_path / "small.weights.h5"
    build_trunk("resnet_small", (32, 32, 3), seed=4).save_weights(trunk)
    with pytest.raises(ModelError, match=rf"^{trunk}: cannot be read as efficientnetv2_b0 trunk weights: "):
        load_backbone_weights(build_model("efficientnetv2_b0", (32, 32, 3), 3), "efficientnetv2_b0", trunk,
                              (32, 32, 3))


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory, sample_dataset):
    """resnet_small from a trunk weights file, trunk frozen in epoch 1 of 2, uninterrupted:
    (project, trunk model, output lines, the same project stopped after epoch 1)."""
    from deepdanbooru.models.backbone import build_trunk
    from deepdanbooru.training.train import train_project

    root = tmp_path_factory.mktemp("frozen")
    trunk = build_trunk("resnet_small", (32, 32, 3), seed=4)
    trunk.save_weights(root / "trunk.weights.h5")
    keys = dict(backbone_weights=str(root / "trunk.weights.h5"), freeze_backbone_epochs=1)
    project = make_project(root / "project", *sample_dataset, **keys)
    lines = []
    train_project(project, echo=lines.append)
    # Still holds ckpt-1 to ckpt-3, the first epoch's slices.
    stopped = make_project(root / "stopped", *sample_dataset, **keys, epoch_count=1)
    train_project(stopped, echo=lambda *_: None)
    return project, trunk, lines, stopped


@pytest.mark.slow
def test_frozen_epoch_trains_only_the_head_then_everything(frozen_run):
    from deepdanbooru.models.head import trunk_layers

    project, trunk, lines, _ = frozen_run
    assert any(line.startswith("Backbone: ") and "trunk layers from " in line for line in lines)
    assert any("Backbone frozen for epochs 1 to 1" in line for line in lines)
    assert any("Backbone unfrozen from epoch 2" in line for line in lines)
    after_1 = keras.models.load_model(project / "model-resnet_small.e1.keras")
    after_2 = keras.models.load_model(project / "model-resnet_small.e2.keras")
    # Exports are whole trainable models even when written during the frozen epoch.
    assert all(layer.trainable for layer in after_1.layers)
    for layer in trunk.layers:
        if layer.weights:
            # Epoch 1: the trunk, batch-norm statistics included, is the file's exactly.
            for ours, theirs in zip(after_1.get_layer(layer.name).get_weights(), layer.get_weights()):
                np.testing.assert_array_equal(ours, theirs)
    moved = [layer.name for layer in trunk_layers(after_2)
             if not np.array_equal(layer.get_weights()[0], after_1.get_layer(layer.name).get_weights()[0])]
    assert "stem_conv" in moved
    assert not np.array_equal(after_1.get_layer("head_conv").get_weights()[0],
                              build_model("resnet_small", (32, 32, 3), 17).get_layer("head_conv").get_weights()[0])


@pytest.mark.slow
def test_resume_across_the_freeze_switch_is_exact(frozen_run, tmp_path):
    """ckpt-2 is inside the frozen epoch: the resumed run freezes again, then switches."""
    checkpoint = "ckpt-2"
    from deepdanbooru.training.train import train_project

    project, _, _, stopped = frozen_run
    copy = tmp_path / "copy"
    shutil.copytree(stopped, copy)
    (copy / "checkpoints" / "checkpoint").write_text(
        f'model_checkpoint_path: "{checkpoint}"\nall_model_checkpoint_paths: "{checkpoint}"\n')
    for export in copy.glob("*.keras"):
        export.unlink()
    # A resumed run takes the trunk from its checkpoint: the file is not needed any more.
    set_config(copy, epoch_count=2, backbone_weights=str(tmp_path / "gone.weights.h5"))
    lines = []
    train_project(copy, echo=lines.append)
    assert any(line.startswith("Resuming from ") for line in lines)
    assert not any(line.startswith("Backbone: ") for line in lines)
    for name in ("model-resnet_small.e1.keras", "model-resnet_small.e2.keras", "model-resnet_small.keras"):
        assert_same_weights(project / name, copy / name)
