"""The recipe keys one at a time: loss, optimizers, schedule, priors, EMA, head, config."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from deepdanbooru.errors import ConfigError
from deepdanbooru.models.head import grow_vocabulary, head_layer, set_head_bias
from deepdanbooru.models.losses import Asymmetric, make_loss, project_loss
from deepdanbooru.models.optimizers import decay_exempt, make_optimizer
from deepdanbooru.project.config import load_config
from deepdanbooru.project.tags import tag_counts
from deepdanbooru.training.ema import WeightAverage
from deepdanbooru.training.priors import log_frequency_weights, log_odds
from deepdanbooru.training.schedule import LearningRateSchedule


def write_config(tmp_path, **values):
    (tmp_path / "project.json").write_text(json.dumps(values))
    return load_config(tmp_path)


# --- loss ---

def asl_reference(y, p, gamma_neg=4.0, gamma_pos=0.0, clip=0.05):
    """The paper's formula in float64, one element at a time."""
    shifted = max(p - clip, 0.0)
    positive = (1 - p) ** gamma_pos * math.log(max(p, 1e-8))
    negative = shifted ** gamma_neg * math.log(max(1 - shifted, 1e-8))
    return -(y * positive + (1 - y) * negative)


def test_asymmetric_loss_matches_the_paper_formula():
    y = np.array([[1, 0, 0, 1, 0.3], [0, 1, 0, 0, 1]], np.float32)
    p = np.array([[0.9, 0.02, 0.6, 0.3, 0.5], [0.99, 0.4, 0.051, 0.05, 0.7]], np.float32)
    for options in ({}, {"gamma_neg": 2.0, "gamma_pos": 1.0, "clip": 0.0}):
        expected = np.array([[asl_reference(a, b, **options) for a, b in zip(row_y, row_p)]
                             for row_y, row_p in zip(y, p)])
        got = keras.ops.convert_to_numpy(Asymmetric(**options)(y, p))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        per_sample = keras.ops.convert_to_numpy(make_loss("asymmetric", "none", options)(y, p))
        np.testing.assert_allclose(per_sample, expected.mean(axis=-1), rtol=1e-5)
    # A negative under the margin costs nothing; the default positive term is plain log-loss.
    assert asl_reference(0, 0.04) == 0.0
    assert float(Asymmetric()(np.float32(1), np.float32(0.5))) == pytest.approx(math.log(2), rel=1e-6)


def test_asymmetric_gradient_is_finite_at_saturated_scores():
    p = tf.Variable([[0.0, 1.0, 0.03, 1.0, 0.0]])
    y = tf.constant([[1.0, 1.0, 0.0, 0.0, 0.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(Asymmetric()(y, p))
    assert np.isfinite(tape.gradient(loss, p).numpy()).all()


def test_tag_loss_weights_weigh_each_tag():
    y = np.array([[1, 0, 1], [0, 0, 1]], np.float32)
    p = np.array([[0.7, 0.2, 0.4], [0.1, 0.6, 0.9]], np.float32)
    weights = [0.5, 1.0, 1.5]
    elementwise = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    got = keras.ops.convert_to_numpy(make_loss("binary_crossentropy", "none", tag_weights=weights)(y, p))
    np.testing.assert_allclose(got, (elementwise * weights).mean(axis=-1), rtol=1e-5)
    # Without tag weights the loss is Keras's own BinaryCrossentropy, as before the weights existed.
    plain = make_loss("binary_crossentropy", "none")
    assert isinstance(plain, keras.losses.BinaryCrossentropy)


def test_project_loss_takes_the_asl_keys(tmp_path):
    config = write_config(tmp_path, loss="asymmetric", asl_gamma_neg=2, asl_gamma_pos=1, asl_clip=0.1)
    loss = project_loss(config, "none")
    assert loss.elementwise == Asymmetric(2.0, 1.0, 0.1)


# --- priors ---

def test_priors_from_the_training_records():
    counts = tag_counts(["a b  b", "b c", "zz b", ""], ["a", "b", "c", "d"])
    assert counts == [1, 3, 1, 0]
    odds = log_odds(counts, 4)
    assert odds[0] == pytest.approx(math.log(0.3 / 0.7)) and odds[1] > 0 > odds[0] > odds[3]
    weights = log_frequency_weights(counts, 4)
    assert sum(weights) / 4 == pytest.approx(1.0)
    assert weights[3] == weights[0] > weights[1]  # never seen counts as once; rarer weighs more


# --- schedule ---

def test_warmup_cosine_is_a_function_of_used_minibatch(tmp_path):
    config = write_config(tmp_path, lr_schedule="warmup_cosine", learning_rate=0.1, min_learning_rate=0.01,
                          warmup_epochs=0.5, epoch_count=3, minibatch_size=4)
    schedule = LearningRateSchedule(config, 22)  # 6 minibatches an epoch, warmup 3, 18 in all
    rates = [schedule.rate(u // 6, u) for u in range(20)]
    assert rates[:3] == pytest.approx([0.1 / 3, 0.2 / 3, 0.1])
    assert rates[3] == pytest.approx(0.1)
    assert rates[3 + 15 // 2] < 0.1 and all(a >= b for a, b in zip(rates[3:], rates[4:]))
    assert rates[17] == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * 14 / 15)))
    assert rates[18] == rates[19] == 0.01
    steps = LearningRateSchedule(write_config(tmp_path, learning_rates=[{"used_epoch": 1, "learning_rate": 0.5}]), 22)
    assert not steps.per_minibatch and [steps.rate(e, 99) for e in range(3)] == [0.001, 0.5, 0.5]


# --- optimizers ---

def tiny_model():
    inputs = keras.Input((4, 4, 2))
    x = keras.layers.Conv2D(3, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.LayerNormalization(name="ln")(x)
    x = keras.layers.Dense(5, name="head")(x)
    return keras.Model(inputs, keras.layers.Activation("sigmoid", name="output")(x))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_weight_decay_spares_biases_and_norms(name):
    keras.utils.set_random_seed(1)
    model = tiny_model()
    exempt = {v.path for v in decay_exempt(model, "resnet_small")}
    assert exempt == {"conv/bias", "bn/gamma", "bn/beta", "ln/gamma", "ln/beta", "head/bias"}
    optimizer = make_optimizer(name, 0.1, weight_decay=0.5, decay_exempt_variables=decay_exempt(model, "resnet_small"))
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    # With zero gradients both steps are zero (lamb's trust ratio is 1 then): what moves is the decay alone.
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in model.trainable_variables])
    for variable in model.trainable_variables:
        old = before[variable.path]
        if variable.path in exempt:
            np.testing.assert_array_equal(variable.numpy(), old)
        else:
            np.testing.assert_allclose(variable.numpy(), old * 0.95, rtol=1e-6)
    assert make_optimizer("adam", 0.1).weight_decay is None


def _steps(name, model, optimizer, count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        images = tf.constant(rng.normal(size=(2, 4, 4, 2)), tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_optimizer_state_resumes_bit_exactly(name, tmp_path):
    def fresh():
        keras.utils.set_random_seed(3)
        model = tiny_model()
        optimizer = make_optimizer(name, 0.01, weight_decay=0.1, decay_exempt_variables=decay_exempt(model, "resnet_small"))
        optimizer.build(model.trainable_variables)
        return model, optimizer

    model, optimizer = fresh()
    _steps(name, model, optimizer, 2, seed=0)
    _steps(name, model, optimizer, 2, seed=1)
    resumed, resumed_optimizer = fresh()
    _steps(name, resumed, resumed_optimizer, 2, seed=0)
    path = tf.train.Checkpoint(model=resumed, optimizer=resumed_optimizer).write(str(tmp_path / "ckpt"))
    again, again_optimizer = fresh()
    tf.train.Checkpoint(model=again, optimizer=again_optimizer).read(path).assert_existing_objects_matched()
    _steps(name, again, again_optimizer, 2, seed=1)
    for a, b in zip(model.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- EMA ---

def test_weight_average_updates_and_swaps_back_exactly():
    model = tiny_model()
    average = WeightAverage(model, 0.75)
    start = [w.numpy().copy() for w in average.weights]
    for weight in average.weights:
        weight.assign(weight + 1.0)
    trained = [w.numpy().copy() for w in average.weights]
    average.update(100)  # past the warm-up: (1 + 100) / (10 + 100) > 0.75
    expected = [np.float32(0.75) * s + np.float32(0.25) * t for s, t in zip(start, trained)]
    for got, want in zip(average.averages, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    with average.swapped():
        with average.swapped():  # nested: still the average
            for weight, want in zip(average.weights, expected):
                np.testing.assert_allclose(weight.numpy(), want, rtol=1e-6)
    for weight, want in zip(average.weights, trained):
        np.testing.assert_array_equal(weight.numpy(), want)
    assert len(average.weights) == len(model.weights)  # batch-norm statistics too


def test_weight_average_warms_up_and_resumes_exactly(tmp_path):
    """d = min(decay, (1 + n) / (10 + n)): the first average is mostly the trained weights, not the start;
    an average restored from a checkpoint with the step count goes on exactly as one never stopped."""
    rng = np.random.default_rng(3)
    model = tiny_model()
    steps = [[rng.normal(size=w.shape).astype(np.float32) for w in model.weights] for _ in range(5)]

    def train(average, first, last):
        for n in range(first, last):
            for weight, value in zip(average.weights, steps[n]):
                weight.assign(value)
            average.update(n)

    uninterrupted = WeightAverage(model, 0.999)
    start = [w.numpy().copy() for w in uninterrupted.weights]
    train(uninterrupted, 0, 1)
    for got, first, begin in zip(uninterrupted.averages, steps[0], start):
        np.testing.assert_allclose(got.numpy(), np.float32(0.1) * begin + np.float32(0.9) * first, rtol=1e-5,
                                   atol=1e-6)
    train(uninterrupted, 1, 5)
    expected = [a.numpy().copy() for a in uninterrupted.averages]

    first_model = tiny_model()
    for weight, value in zip(first_model.weights, start):
        weight.assign(value)
    stopped = WeightAverage(first_model, 0.999)
    train(stopped, 0, 2)
    path = tf.train.Checkpoint(ema=stopped.state).write(str(tmp_path / "ckpt"))
    resumed = WeightAverage(tiny_model(), 0.999)
    tf.train.Checkpoint(ema=resumed.state).read(path).assert_existing_objects_matched()
    train(resumed, 2, 5)
    for got, want in zip(resumed.averages, expected):
        np.testing.assert_array_equal(got.numpy(), want)


# --- head ---

def test_head_bias_and_vocabulary_growth_keep_rows_exactly():
    keras.utils.set_random_seed(2)
    model = tiny_model()
    assert head_layer(model).name == "head"
    set_head_bias(model, [0.0, 1.0, 2.0, 3.0, 4.0])
    source_tags = ["a", "b", "c", "d", "e"]
    tags = ["e", "x", "a", "c", "y", "z"]
    new_bias = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    grown, summary = grow_vocabulary(model, source_tags, tags, new_bias)
    assert summary == {"kept": 3, "new": 3, "dropped": 2}
    assert grown.output_shape == (None, 6)
    kernel, bias = model.get_layer("head").get_weights()
    new_kernel, grown_bias = grown.get_layer("head").get_weights()
    for new, old in ((0, 4), (2, 0), (3, 2)):
        np.testing.assert_array_equal(new_kernel[:, new], kernel[:, old])
        assert grown_bias[new] == bias[old]
    assert list(grown_bias[[1, 4, 5]]) == [11.0, 14.0, 15.0]
    for layer in model.layers:
        if layer.name != "head" and layer.weights:
            for a, b in zip(layer.get_weights(), grown.get_layer(layer.name).get_weights()):
                np.testing.assert_array_equal(a, b)


def test_growth_into_a_head_without_bias_starts_new_tags_at_their_prior():
    """A DeepDanbooru-style head (1x1 conv without bias -> average pooling -> sigmoid) gains a bias: kept tags
    answer exactly as before, every new tag answers its prior for every image."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.Conv2D(3, 1, use_bias=False)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Activation("sigmoid")(x))
    prior = [-1.0, -2.0, -3.0, -4.0]
    grown, summary = grow_vocabulary(model, ["a", "b", "c"], ["c", "x", "a", "y"], prior)
    assert summary == {"kept": 2, "new": 2, "dropped": 1}
    images = np.random.default_rng(0).uniform(size=(5, 6, 6, 3)).astype(np.float32)
    before, after = (keras.ops.convert_to_numpy(m(images)) for m in (model, grown))
    np.testing.assert_allclose(after[:, [0, 2]], before[:, [2, 0]], rtol=1e-6)
    expected = 1 / (1 + np.exp(-np.array([prior[1], prior[3]], dtype=np.float32)))
    np.testing.assert_allclose(after[:, [1, 3]], np.broadcast_to(expected, (5, 2)), rtol=1e-6)


# --- config ---

@pytest.mark.parametrize("values, message", [
    ({"weight_decay": 0.1}, "weight_decay: is used only with optimizer adamw or lamb, but optimizer is \"adam\""),
    ({"asl_clip": 0.1}, "asl_clip: is used only with loss asymmetric"),
    ({"warmup_epochs": 2}, "warmup_epochs: is used only with lr_schedule warmup_cosine"),
    ({"lr_schedule": "warmup_cosine", "learning_rates": [{"used_epoch": 1, "learning_rate": 0.1}]},
     "learning_rates: is used only with lr_schedule steps"),
    ({"lr_schedule": "warmup_cosine", "min_learning_rate": 0.01, "learning_rate": 0.001},
     "min_learning_rate: must be <= learning_rate (0.001), got 0.01"),
    ({"ema_decay": 1}, "ema_decay: must be < 1.0, got 1"),
    ({"ema_decay": 0}, "ema_decay: must be > 0.0"),
    ({"head_bias_init": "prior"}, "head_bias_init: must be one of zeros, log_prior"),
    ({"tag_loss_weights": "log"}, "tag_loss_weights: must be one of log_frequency"),
    ({"lr_schedule": "cosine"}, "lr_schedule: must be one of steps, warmup_cosine"),
    ({"loss": "asymmetric", "asl_gamma_neg": -1}, "asl_gamma_neg: must be >= 0.0"),
])
def test_recipe_keys_are_validated(tmp_path, values, message):
    with pytest.raises(ConfigError) as caught:
        write_config(tmp_path, **values)
    assert str(caught.value).startswith(str(tmp_path / "project.json"))
    assert message in str(caught.value)


def test_a_refused_value_is_not_reported_again_as_its_default(tmp_path):
    """lr_schedule "cosine" is refused; warmup_epochs is then not said to conflict with the default "steps"."""
    with pytest.raises(ConfigError) as caught:
        write_config(tmp_path, lr_schedule="cosine", warmup_epochs=2)
    assert str(caught.value) == (f"{tmp_path / 'project.json'}: lr_schedule: must be one of steps, warmup_cosine, "
                                 "got \"cosine\" (did you mean 'warmup_cosine'?)")


def test_defaults_are_deepdanbooru_and_decay_defaults_for_adamw(tmp_path):
    config = write_config(tmp_path)
    assert (config.lr_schedule, config.ema_decay, config.head_bias_init, config.tag_loss_weights, config.decay) \
        == ("steps", None, "zeros", None, None)
    assert write_config(tmp_path, optimizer="adamw").decay == 0.05
    assert write_config(tmp_path, optimizer="lamb", weight_decay=0).decay == 0.0


def test_log_prior_is_refused_for_a_head_without_a_bias():
    from deepdanbooru.errors import ModelError
    from deepdanbooru.models.table import check_head_bias_init, head_has_bias

    # resnet_small's head is a 1x1 convolution without bias: refused, naming the key.
    assert not head_has_bias("resnet_small")
    with pytest.raises(ModelError, match="^project.json: head_bias_init: log_prior sets the output bias"):
        check_head_bias_init("resnet_small", "log_prior", "project.json")
    check_head_bias_init("resnet_small", "zeros", "project.json")


def test_log_prior_sets_the_bias_of_a_head_that_has_one():
    from deepdanbooru.models import build_model
    from deepdanbooru.models.table import check_head_bias_init, head_has_bias

    assert head_has_bias("vit_small_patch16")
    check_head_bias_init("vit_small_patch16", "log_prior", "project.json")
    model = build_model("vit_small_patch16", (32, 32, 3), 3, seed=0)
    prior = log_odds(np.array([1, 5, 9]), 10)
    set_head_bias(model, prior)
    np.testing.assert_array_equal(head_layer(model).bias.numpy(), np.asarray(prior, dtype=np.float32))
