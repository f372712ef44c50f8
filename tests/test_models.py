import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap

import h5py
import keras
import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.errors import ModelError
from deepdanbooru.models import (
    build_model,
    check_model_input,
    count_weights,
    load_model_file,
    make_loss,
    make_optimizer,
    minimum_input_size,
    model_names,
    parameter_counts,
)
from deepdanbooru.project import config as project_config

# (trainable, non_trainable) at 299x299 with 1000 tags. The first three are
# DeepDanbooru's published figures; the others were measured once by building them.
REFERENCE_COUNTS = {
    "resnet_152": (60_192_808, 151_424),
    "resnet_custom_v1": (122_053_696, 196_480),
    "resnet_custom_v2": (123_713_600, 299_904),
    "resnet_custom_v3": (127_573_056, 210_816),
    "resnet_custom_v4": (58_941_504, 146_304),
    "resnet_small": (1_391_184, 7_712),
}


def weights_digest(model):
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(weight.path.encode())
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


def test_registries_match_the_names_project_json_accepts():
    from deepdanbooru.models.losses import LOSSES
    from deepdanbooru.models.optimizers import OPTIMIZERS

    assert model_names() == project_config.MODEL_NAMES
    assert tuple(LOSSES) == project_config.LOSS_NAMES
    assert tuple(OPTIMIZERS) == project_config.OPTIMIZER_NAMES


def test_the_registry_is_the_one_place_a_model_is_configured():
    from deepdanbooru import registry

    for family in registry.FAMILIES.values():
        for reference in (family.trunk, family.counter, family.finish or family.trunk):
            assert callable(registry.resolve(reference)), reference
    assert all(callable(registry.resolve(head.builder)) for head in registry.HEADS.values())
    with pytest.raises(ValueError, match="registered twice"):
        registry.register_model("resnet_small", widths=(8,), repeats=(1,), head="conv")
    with pytest.raises(ValueError, match="unknown family 'mlp'"):
        registry.register_model("mlp_tiny", widths=(8,), repeats=(1,), head="conv", family="mlp")
    assert registry.model_names() == model_names() and "mlp_tiny" not in registry.MODELS


@pytest.mark.parametrize("name", sorted(REFERENCE_COUNTS))
def test_parameter_counts_of_all_six_models_at_reference_size(name):
    assert parameter_counts(name, (299, 299, 3), 1000) == REFERENCE_COUNTS[name]


def test_conv_head_counts_do_not_depend_on_input_size():
    for name in REFERENCE_COUNTS:
        if name != "resnet_152":
            assert parameter_counts(name, (64, 48, 3), 1000) == REFERENCE_COUNTS[name]


@pytest.mark.parametrize("input_shape, n_tags", [((64, 64, 3), 10), ((37, 20, 3), 1)])
def test_analytic_counts_equal_a_real_build(input_shape, n_tags):
    model = build_model("resnet_small", input_shape, n_tags)
    assert count_weights(model) == parameter_counts("resnet_small", input_shape, n_tags)
    assert model.input_shape == (None, *input_shape)
    assert model.output_shape == (None, n_tags)


@pytest.mark.slow
def test_resnet_152_real_build_counts_and_head():
    # 193 is the smallest side that leaves a 7x7 map; 449 leaves 15 wide, so
    # the valid 7x7 pool yields two columns and the dense input doubles.
    model = build_model("resnet_152", (193, 449, 3), 5)
    assert count_weights(model) == parameter_counts("resnet_152", (193, 449, 3), 5)
    assert model.output_shape == (None, 5)
    pool = model.get_layer("head_pool")
    assert isinstance(pool, keras.layers.AveragePooling2D)
    assert pool.pool_size == (7, 7) and pool.padding == "valid"
    assert pool.output.shape[1:] == (1, 2, 2048)
    assert isinstance(model.get_layer("head_flatten"), keras.layers.Flatten)
    assert model.get_layer("head_dense").units == 5


def test_resnet_152_dense_input_grows_with_the_input():
    small = parameter_counts("resnet_152", (193, 193, 3), 5)[0]
    wide = parameter_counts("resnet_152", (193, 449, 3), 5)[0]
    assert wide - small == 2048 * 5


@pytest.mark.slow
def test_real_builds_at_reference_size_equal_the_reference_counts():
    for name, expected in REFERENCE_COUNTS.items():
        model = build_model(name, (299, 299, 3), 1000)
        assert count_weights(model) == expected, name
        del model
        keras.backend.clear_session()


def test_layers_are_named_stably_and_follow_the_recipe():
    model = build_model("resnet_small", (32, 32, 3), 3)
    names = [layer.name for layer in model.layers]
    assert names[:5] == ["image", "stem_conv", "stem_bn", "stem_relu", "stem_pool"]
    assert names[-3:] == ["head_conv", "head_pool", "output"]
    assert "stage4_block1_add" in names and "stage2_block0_shortcut_conv" in names
    assert "stage1_block2_add" not in names  # resnet_small repeats each stage once
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            assert not layer.use_bias and layer.padding == "same"
    stem = model.get_layer("stem_conv")
    assert stem.kernel_size == (7, 7) and stem.strides == (2, 2) and stem.filters == 16
    assert model.get_layer("stage1_block0_2_conv").strides == (1, 1)
    assert model.get_layer("stage2_block0_2_conv").strides == (2, 2)
    assert model.get_layer("stage2_block0_shortcut_conv").strides == (2, 2)
    # Each residual branch starts switched off: zero gamma on its last norm only.
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma = keras.ops.convert_to_numpy(layer.gamma)
            expected = 0.0 if layer.name.endswith("_3_bn") else 1.0
            assert np.all(gamma == expected), layer.name
    assert model.get_layer("output").get_config()["activation"] == "sigmoid"


def test_initial_weights_are_a_function_of_the_seed_only():
    first = weights_digest(build_model("resnet_small", (32, 32, 3), 3, seed=0))
    # Disturbing Keras' global random state must not change anything.
    keras.utils.set_random_seed(12345)
    keras.random.normal((3,))
    assert weights_digest(build_model("resnet_small", (32, 32, 3), 3, seed=0)) == first
    assert weights_digest(build_model("resnet_small", (32, 32, 3), 3, seed=1)) != first


def test_output_is_float32_under_mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = build_model("resnet_small", (32, 32, 3), 3)
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.get_layer("stem_conv").compute_dtype == "float16"
    assert model.get_layer("head_conv").compute_dtype == "float16"
    assert model.get_layer("output").compute_dtype == "float32"
    assert model.output.dtype == "float32"
    prediction = model(np.zeros((1, 32, 32, 3), np.float32))
    assert keras.backend.standardize_dtype(prediction.dtype) == "float32"
    assert keras.config.dtype_policy().name == previous.name


def test_resnet_152_refuses_small_inputs_before_building():
    assert minimum_input_size("resnet_152") == 193
    assert minimum_input_size("resnet_small") == 1
    check_model_input("resnet_152", (193, 193, 3))
    with pytest.raises(ModelError) as caught:
        build_model("resnet_152", (299, 192, 3), 10)
    message = str(caught.value)
    assert "resnet_152 needs an input of at least 193x193" in message and "299x192 gives 10x6" in message
    with pytest.raises(ModelError) as caught:
        check_model_input("resnet_152", (128, 128, 3), source="/p/project.json")
    assert str(caught.value).startswith("/p/project.json: image_width/image_height: resnet_152 needs")
    # The conv-head models pool globally, so any size works.
    check_model_input("resnet_custom_v2", (1, 1, 3))


def test_unknown_model_names_the_valid_ones_and_a_close_match():
    with pytest.raises(ModelError) as caught:
        build_model("resnet_custom_v5", (64, 64, 3), 10)
    message = str(caught.value)
    assert "did you mean 'resnet_custom_v4'" in message
    assert all(name in message for name in model_names())
    with pytest.raises(ModelError) as caught:
        check_model_input("resnet", (64, 64, 3), source="proj/project.json")
    assert str(caught.value).startswith("proj/project.json: model: unknown model 'resnet'")


@pytest.mark.parametrize("bad", [(64, 64), (0, 64, 3), (64.0, 64, 3)])
def test_bad_input_shapes_and_tag_counts_are_model_errors(bad):
    with pytest.raises(ModelError, match="input shape must be"):
        check_model_input("resnet_small", bad)
    with pytest.raises(ModelError, match="n_tags"):
        build_model("resnet_small", (32, 32, 3), 0)


def test_focal_loss_on_a_hand_computed_case():
    y_true = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    y_pred = np.array([[0.9, 0.2], [0.3, 0.6]], np.float32)
    # -alpha_t * (1 - p_t)^2 * log(p_t), alpha_t = 0.25 for positives, 0.75 for negatives
    terms = [
        -0.25 * 0.1**2 * math.log(0.9),
        -0.75 * 0.2**2 * math.log(0.8),
        -0.75 * 0.3**2 * math.log(0.7),
        -0.25 * 0.4**2 * math.log(0.6),
    ]
    loss = float(make_loss("focal_loss")(y_true, y_pred))
    assert loss == pytest.approx(sum(terms) / 4, rel=1e-5)
    assert loss == pytest.approx(0.0128665, rel=1e-4)
    per_sample = keras.ops.convert_to_numpy(make_loss("focal_loss", reduction="none")(y_true, y_pred))
    np.testing.assert_allclose(per_sample, [sum(terms[:2]) / 2, sum(terms[2:]) / 2], rtol=1e-5)
    # A saturated wrong answer is clipped to 1 - 1e-7 (as float32), not infinite.
    saturated = float(make_loss("focal_loss")(np.array([[0.0]], np.float32), np.array([[1.0]], np.float32)))
    p_t = 1.0 - float(np.float32(1.0 - 1e-7))
    assert saturated == pytest.approx(-0.75 * (1 - p_t) ** 2 * math.log(p_t), rel=1e-4)


def test_binary_crossentropy_is_the_mean_over_all_elements():
    y_true = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    y_pred = np.array([[0.8, 0.1, 0.6], [0.3, 0.2, 0.9]], np.float32)
    expected = -np.mean(y_true * np.log(y_pred) + (1 - y_true) * np.log(1 - y_pred))
    assert float(make_loss("binary_crossentropy")(y_true, y_pred)) == pytest.approx(expected, rel=1e-5)


def test_unsupported_loss_and_optimizer_are_model_errors():
    with pytest.raises(ModelError, match="unsupported loss 'mse'.*binary_crossentropy, focal_loss"):
        make_loss("mse")
    with pytest.raises(ModelError, match="unsupported optimizer 'adagrad'.*adam, sgd, rmsprop"):
        make_optimizer("adagrad", 0.1)


def test_optimizer_registry():
    sgd = make_optimizer("sgd", 0.05)
    assert isinstance(sgd, keras.optimizers.SGD)
    assert sgd.momentum == 0.9 and sgd.nesterov is True
    assert float(sgd.learning_rate) == pytest.approx(0.05)
    adam = make_optimizer("adam", 0.001, clipnorm=1.5)
    assert isinstance(adam, keras.optimizers.Adam) and adam.clipnorm == 1.5
    assert make_optimizer("adam", 0.001).clipnorm is None
    assert isinstance(make_optimizer("rmsprop", 0.01), keras.optimizers.RMSprop)


# Runs without deepdanbooru first (an export must open with plain Keras),
# then imports it to check that a fresh process builds the same initial weights.
_CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np, keras
    model = keras.models.load_model(sys.argv[1])
    plain = "deepdanbooru" not in sys.modules
    x = np.load(sys.argv[2])
    prediction = keras.ops.convert_to_numpy(model(x)).tolist()
    from deepdanbooru.models import build_model
    digest = hashlib.sha256()
    for weight in build_model("resnet_small", (32, 32, 3), 3, seed=7).weights:
        digest.update(weight.path.encode())
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    print(json.dumps({"plain": plain, "prediction": prediction, "digest": digest.hexdigest()}))
    """
)


@pytest.mark.slow
def test_export_opens_with_plain_keras_and_seeded_weights_match_across_processes(tmp_path):
    model = build_model("resnet_small", (32, 32, 3), 3, seed=7)
    # Move the norms away from their initial values so the round trip is tested.
    rng = np.random.default_rng(1)
    model.set_weights([w + rng.normal(scale=0.01, size=w.shape).astype(w.dtype) for w in model.get_weights()])
    path = tmp_path / "model-resnet_small.keras"
    model.save(path)
    x = np.random.default_rng(0).uniform(size=(2, 32, 32, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = keras.ops.convert_to_numpy(model(x))

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "x.npy")],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.strip().splitlines()[-1])
    assert child["plain"] is True
    np.testing.assert_allclose(child["prediction"], expected, atol=1e-6)
    assert child["digest"] == weights_digest(build_model("resnet_small", (32, 32, 3), 3, seed=7))

    loaded = load_model_file(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), expected, atol=1e-6)


def _legacy_layer(cls, name, config, inbound):
    nodes = [[[source, 0, 0, {}] for source in inbound]] if inbound else []
    return {"class_name": cls, "name": name, "inbound_nodes": nodes,
            "config": dict(config, name=name, trainable=True)}


def write_tf_keras2_h5(path, n_tags=3, channels=4, mixed=True):
    """A whole-model .h5 laid out as tf.keras 2.x saved DeepDanbooru 1.0 exports:
    old-style config (batch_input_shape, list axis, nested inbound nodes, "Policy"
    dtypes under mixed precision), ":0" weight names, a compiled training config."""
    rng = np.random.default_rng(0)
    dtype = {"class_name": "Policy", "config": {"name": "mixed_float16"}} if mixed else "float32"

    def conv(filters, kernel):
        return {"dtype": dtype, "filters": filters, "kernel_size": [kernel, kernel], "strides": [1, 1],
                "padding": "same", "data_format": "channels_last", "dilation_rate": [1, 1], "groups": 1,
                "activation": "linear", "use_bias": False,
                "kernel_initializer": {"class_name": "HeNormal", "config": {"seed": None}},
                "bias_initializer": {"class_name": "Zeros", "config": {}}}

    norm = {"dtype": dtype, "axis": [3], "momentum": 0.99, "epsilon": 0.001, "center": True, "scale": True}
    layers = [
        {"class_name": "InputLayer", "name": "input_1", "inbound_nodes": [],
         "config": {"batch_input_shape": [None, 16, 16, 3], "dtype": "float32", "sparse": False,
                    "ragged": False, "name": "input_1"}},
        _legacy_layer("Conv2D", "conv2d", conv(channels, 3), ["input_1"]),
        _legacy_layer("BatchNormalization", "batch_normalization", norm, ["conv2d"]),
        _legacy_layer("Activation", "activation", {"dtype": dtype, "activation": "relu"}, ["batch_normalization"]),
        _legacy_layer("MaxPooling2D", "max_pooling2d", {"dtype": dtype, "pool_size": [3, 3], "padding": "same",
                      "strides": [2, 2], "data_format": "channels_last"}, ["activation"]),
        _legacy_layer("Conv2D", "conv2d_1", conv(channels, 1), ["max_pooling2d"]),
        _legacy_layer("Add", "add", {"dtype": dtype}, ["max_pooling2d", "conv2d_1"]),
        _legacy_layer("Conv2D", "conv2d_2", conv(n_tags, 1), ["add"]),
        _legacy_layer("GlobalAveragePooling2D", "global_average_pooling2d",
                      {"dtype": dtype, "data_format": "channels_last"}, ["conv2d_2"]),
        _legacy_layer("Activation", "activation_1", {"dtype": "float32", "activation": "sigmoid"},
                      ["global_average_pooling2d"]),
    ]
    config = {"class_name": "Functional", "keras_version": "2.4.0", "backend": "tensorflow",
              "config": {"name": "resnet_custom_v3", "layers": layers, "input_layers": [["input_1", 0, 0]],
                         "output_layers": [["activation_1", 0, 0]]}}
    training = {"loss": "binary_crossentropy", "loss_weights": None, "weighted_metrics": None,
                "metrics": [{"class_name": "Precision", "config": {"name": "precision", "dtype": "float32"}},
                            {"class_name": "Recall", "config": {"name": "recall", "dtype": "float32"}}],
                "optimizer_config": {"class_name": "SGD", "config": {
                    "name": "SGD", "learning_rate": 0.001, "decay": 0.0, "momentum": 0.9, "nesterov": True}}}
    weights = {
        "conv2d": {"kernel": rng.normal(size=(3, 3, 3, channels))},
        "batch_normalization": {"gamma": rng.uniform(0.5, 1.5, channels), "beta": rng.normal(size=channels),
                                "moving_mean": rng.normal(size=channels),
                                "moving_variance": rng.uniform(0.5, 2.0, channels)},
        "conv2d_1": {"kernel": rng.normal(size=(1, 1, channels, channels))},
        "conv2d_2": {"kernel": rng.normal(size=(1, 1, channels, n_tags))},
    }
    weights = {layer: {k: v.astype(np.float32) for k, v in values.items()} for layer, values in weights.items()}
    with h5py.File(path, "w") as f:
        f.attrs.update({"keras_version": b"2.4.0", "backend": b"tensorflow",
                        "model_config": json.dumps(config).encode(), "training_config": json.dumps(training).encode()})
        group = f.create_group("model_weights")
        group.attrs["layer_names"] = [layer["name"].encode() for layer in layers]
        for layer in layers:
            name = layer["name"]
            values = weights.get(name, {})
            layer_group = group.create_group(name)
            layer_group.attrs["weight_names"] = [f"{name}/{w}:0".encode() for w in values]
            for w, value in values.items():
                layer_group.create_dataset(f"{name}/{w}:0", data=value)
        optimizer = f.create_group("optimizer_weights")
        optimizer.attrs["weight_names"] = [b"SGD/iter:0"]
        optimizer.create_dataset("SGD/iter:0", data=np.int64(7))
    return weights


@pytest.mark.parametrize("mixed", [True, False])
def test_deepdanbooru_1_h5_export_opens(tmp_path, mixed):
    path = tmp_path / "model-resnet_custom_v3.h5"
    weights = write_tf_keras2_h5(path, n_tags=3, mixed=mixed)
    model = load_model_file(path)
    assert model.input_shape == (None, 16, 16, 3) and model.output_shape == (None, 3)
    assert model.get_layer("conv2d").compute_dtype == ("float16" if mixed else "float32")
    for layer, values in weights.items():
        loaded = dict(zip([w.name for w in model.get_layer(layer).weights], model.get_layer(layer).get_weights()))
        for name, value in values.items():
            np.testing.assert_array_equal(loaded[name], value)
    prediction = model.predict(np.full((2, 16, 16, 3), 0.5, np.float32), verbose=0)
    assert isinstance(prediction, np.ndarray) and prediction.shape == (2, 3) and prediction.dtype == np.float32
    assert np.all((prediction > 0) & (prediction < 1))


def test_h5_written_by_keras_3_opens(tmp_path):
    model = build_model("resnet_small", (32, 32, 3), 2)
    path = tmp_path / "model.h5"
    model.save(path)
    x = np.ones((1, 32, 32, 3), np.float32)
    loaded = load_model_file(path)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_a_sequential_model_opens_as_the_same_functional_model(tmp_path):
    """Loaded, a Sequential model has no `input`: everything that reads one (inference, --source-model) failed."""
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, name="conv"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="sigmoid")])
    model.save(tmp_path / "sequential.keras")
    loaded = load_model_file(tmp_path / "sequential.keras")
    x = np.random.default_rng(0).random((2, 16, 16, 3)).astype(np.float32)
    assert not isinstance(loaded, keras.Sequential) and loaded.input.shape == (None, 16, 16, 3)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x)), atol=1e-6)


def test_missing_corrupt_or_unknown_model_files_are_model_errors(tmp_path):
    with pytest.raises(ModelError, match="missing.keras: model file not found"):
        load_model_file(tmp_path / "missing.keras")
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelError) as caught:
        load_model_file(corrupt)
    assert str(caught.value).startswith(f"{corrupt}: cannot be opened as a Keras model: it is not a whole zip "
                                        "archive (21 bytes: cut short, or another kind of file)")
    assert "\n" not in str(caught.value) and "File not found" not in str(caught.value)
    (tmp_path / "empty.keras").write_bytes(b"")
    with pytest.raises(ModelError, match=r"empty.keras: cannot be opened as a Keras model: it is empty \(0 bytes\)"):
        load_model_file(tmp_path / "empty.keras")
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(ModelError, match="truncated.h5: cannot be opened as a Keras model"):
        load_model_file(truncated)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelError, match=r"weights.bin: expected a \.keras or \.h5 or \.hdf5 model file"):
        load_model_file(other)


def test_show_model_json_and_text():
    runner = CliRunner()
    result = runner.invoke(main, ["show-model", "resnet_small", "--width", "64", "--height", "48",
                                  "--tags", "5", "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["input_shape"] == [48, 64, 3] and info["output_shape"] == [5]
    assert (info["trainable"], info["non_trainable"]) == parameter_counts("resnet_small", (48, 64, 3), 5)
    assert info["model"] == "resnet_small"

    result = runner.invoke(main, ["show-model", "resnet_small", "--tags", "1000"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "input shape:              (299, 299, 3)" in result.output
    assert "trainable parameters:     1,391,184" in result.output
    assert "non-trainable parameters: 7,712" in result.output


def test_show_model_errors_exit_2_with_one_line():
    runner = CliRunner()
    result = runner.invoke(main, ["show-model", "resnet_152", "--width", "128", "--height", "128"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: resnet_152 needs an input of at least 193x193 (its final feature map must be at least 7x7 "
        "for the 7x7 average pool); 128x128 gives 4x4"
    ]
    result = runner.invoke(main, ["show-model", "resnet_smal"])
    assert result.exit_code == 2 and "did you mean 'resnet_small'" in result.output
