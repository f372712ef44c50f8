"""jit_compile: the strided-maximum MaxPooling2D, the XLA fallback notice, the key, a compiled run and its resume."""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from train_helpers import assert_same_weights, make_project, weights

from deepdanbooru.compiling import XlaFunction, choose_jit_compile, compile_failure_reason, xla_pays
from deepdanbooru.models import build_model
from deepdanbooru.errors import ConfigError
from deepdanbooru.models.pooling import strided_max_pool, use_strided_max_pooling
from deepdanbooru.project.config import load_config


@pytest.fixture(autouse=True, scope="module")
def determinism():
    # As in training: op determinism on, the setting under which XLA refuses MaxPool's gradient.
    tf.config.experimental.enable_op_determinism()


@pytest.mark.parametrize("shape, pool, strides, padding", [
    ((2, 17, 16, 3), (3, 3), (2, 2), "same"),  # the ResNet stem's pool, odd height
    ((2, 16, 16, 3), (3, 3), (2, 2), "valid"),
    ((1, 9, 11, 2), (2, 2), (2, 2), "same"),
    ((2, 8, 8, 4), (3, 2), (1, 2), "same"),
])
def test_strided_max_pool_equals_max_pool_values_and_gradients(shape, pool, strides, padding):
    rng = np.random.default_rng(0)
    x = rng.random(shape).astype(np.float32)
    x[x < 0.5] = 0.0  # ties, as after a relu
    x = tf.constant(x)
    expected = tf.nn.max_pool2d(x, pool, strides, padding.upper())
    upstream = tf.constant(rng.random(expected.shape).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        reference = tf.reduce_sum(tf.nn.max_pool2d(x, pool, strides, padding.upper()) * upstream)
        ours = strided_max_pool(x, pool, strides, padding)
        total = tf.reduce_sum(ours * upstream)
    np.testing.assert_array_equal(ours.numpy(), expected.numpy())
    np.testing.assert_array_equal(tape.gradient(total, x).numpy(), tape.gradient(reference, x).numpy())


def _pooling_model():
    inputs = keras.Input((9, 9, 2))
    x = keras.layers.Conv2D(3, 3, padding="same", name="conv")(inputs)
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool")(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


def test_switched_model_computes_the_same_and_saves_plain_keras(tmp_path):
    model = _pooling_model()
    x = np.random.default_rng(1).random((3, 9, 9, 2)).astype(np.float32)
    before = model(x).numpy()
    assert use_strided_max_pooling(model) == 1
    np.testing.assert_array_equal(model(x).numpy(), before)
    # Under XLA with determinism on, the gradient now compiles.
    step = tf.function(lambda v: tf.gradients(tf.reduce_sum(model(v, training=True)), model.trainable_variables),
                       jit_compile=True)
    assert all(np.isfinite(g.numpy()).all() for g in step(x))
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert [type(layer) for layer in loaded.layers] == [type(layer) for layer in model.layers]
    assert loaded.get_layer("pool").get_config() == model.get_layer("pool").get_config()
    np.testing.assert_array_equal(loaded(x).numpy(), before)


def test_fallback_says_why_once_and_computes_the_same():
    def pool_gradient(x):
        return tf.gradients(tf.reduce_sum(tf.nn.max_pool2d(x, 3, 2, "SAME") ** 2), x)[0]

    notices = []
    function = XlaFunction(pool_gradient, [tf.TensorSpec([None, 8, 8, 1], tf.float32)], True, "the test step",
                           notices.append)
    x = tf.constant(np.random.default_rng(2).random((2, 8, 8, 1)).astype(np.float32))
    result = function(x)
    np.testing.assert_array_equal(result.numpy(), tf.function(pool_gradient)(x).numpy())
    function(x)
    assert function.jit_compile is False
    assert len(notices) == 1
    assert notices[0].startswith("jit_compile: the test step runs without XLA, which cannot compile it: ")
    assert "MaxPool" in notices[0] and "deterministic" in notices[0] and "\n" not in notices[0]


def test_compiled_function_stays_compiled():
    notices = []
    function = XlaFunction(lambda x: x * 2.0, [tf.TensorSpec([None], tf.float32)], True, "doubling", notices.append)
    assert function(tf.constant([1.0, 2.0])).numpy().tolist() == [2.0, 4.0]
    assert function.jit_compile is True and notices == []


def test_other_errors_are_not_taken_for_compile_failures():
    assert compile_failure_reason(tf.errors.InvalidArgumentError(None, None, "Input to reshape is a tensor with 3 "
                                                                            "values")) is None


@pytest.mark.parametrize("value", ["yes", 1, None, "Auto"])
def test_jit_compile_must_be_a_bool_or_auto(sample_project, value):
    config = json.loads((sample_project / "project.json").read_text())
    (sample_project / "project.json").write_text(json.dumps({**config, "jit_compile": value}))
    with pytest.raises(ConfigError) as caught:
        load_config(sample_project)
    message = str(caught.value)
    assert "project.json" in message and "jit_compile" in message and "\n" not in message
    assert 'true, false or "auto"' in message


def test_default_is_auto(sample_project):
    assert load_config(sample_project).jit_compile == "auto"


def _tiny_vit():
    return build_model("vit_small_patch16", (32, 32, 3), 5, seed=0)


def _convolutional(layer):
    inputs = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 2, strides=2, name="patches")(inputs)
    x = layer(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))


@pytest.mark.parametrize("layer, pays", [
    (keras.layers.Dense(4), True),  # only the patch embedding convolves
    (keras.layers.Conv2D(4, 3, padding="same"), False),
    (keras.layers.Conv2D(4, 2, strides=2, groups=2), False),
    (keras.layers.DepthwiseConv2D(3, padding="same"), False),
    (keras.layers.SeparableConv2D(4, 1), False),
])
def test_xla_pays_only_where_every_convolution_is_a_patch_embedding(layer, pays):
    assert xla_pays(_convolutional(layer)) is pays


def test_xla_pays_looks_inside_nested_models():
    inner = _convolutional(keras.layers.DepthwiseConv2D(3, padding="same"))
    outer = keras.Model(inner.input, keras.layers.Dense(2)(inner.output))
    wrapped_inputs = keras.Input((8, 8, 4))
    wrapped = keras.Model(wrapped_inputs, keras.layers.Dense(2)(inner(wrapped_inputs)))
    assert xla_pays(outer) is False and xla_pays(wrapped) is False


def test_auto_compiles_the_vit_and_not_the_resnets():
    vit = _tiny_vit()  # one build: choose_jit_compile only looks at the layers
    notices = []
    assert choose_jit_compile("auto", vit, echo=notices.append) is True
    assert len(notices) == 1 and notices[0].startswith('jit_compile "auto": the training step and validation compile')
    resnet = build_model("resnet_small", (32, 32, 3), 5, seed=0)
    assert choose_jit_compile("auto", resnet, echo=notices.append) is False
    assert choose_jit_compile(True, resnet, echo=notices.append) is True
    assert choose_jit_compile(False, vit, echo=notices.append) is False
    assert len(notices) == 1  # only "auto" choosing XLA says so
    # Replicated, the step cannot compile: "auto" does not try (an explicit true gets the step's own notice).
    assert choose_jit_compile("auto", vit, 2, echo=notices.append) is False and len(notices) == 1


@pytest.mark.slow
def test_partial_training_compiles_and_leaves_its_frozen_stages_alone():
    """trainable_blocks meets jit_compile: resnet_small (its stem's MaxPooling2D computed as strided maxima)
    with only its last stage and head trainable takes compiled steps without a fallback; the frozen stages'
    weights stay bit for bit, the trainable ones move."""
    from deepdanbooru.models import build_model, make_optimizer
    from deepdanbooru.models.partial import partial_training
    from deepdanbooru.training.step import TrainStep

    strategy = tf.distribute.get_strategy()
    with strategy.scope():
        model = build_model("resnet_small", (32, 32, 3), 5, seed=0)
        partial = partial_training(model, "resnet_small", 1)
        partial.freeze()
        assert use_strided_max_pooling(model) >= 1
        optimizer = make_optimizer("adam", 0.01)
        optimizer.build(model.trainable_variables)
    frozen = [(weight.path, weight.numpy()) for layer in partial.frozen for weight in layer.weights]
    trained = [(weight.path, weight.numpy()) for weight in model.trainable_weights]
    assert frozen and trained
    notices = []
    step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False, jit_compile=True,
                     echo=notices.append)
    rng = np.random.default_rng(3)
    batch = {"image": tf.constant(rng.random((4, 32, 32, 3)).astype(np.float32)),
             "label": tf.constant((rng.random((4, 5)) < 0.4).astype(np.float32))}
    step.bind({key: tf.TensorSpec([None, *value.shape[1:]], value.dtype) for key, value in batch.items()})
    step(batch)
    step(batch)
    assert notices == [] and step.jit_compile
    by_path = {weight.path: weight.numpy() for weight in model.weights}
    for path, before in frozen:
        np.testing.assert_array_equal(by_path[path], before, err_msg=path)
    assert any(not np.array_equal(by_path[path], before) for path, before in trained)
