"""weight_decay_toward "start" (L2-SP) and known_head_rate: a fine-tune held near its source while it trains. The
start and the known tags are kept in the checkpoint, so a resumed run steps exactly as one that never stopped."""

import numpy as np
import pytest
from test_wise_ft import by_name, source, start_weights, weights_of  # noqa: F401  (source: a fixture)
from train_helpers import head_model, make_project

from deepdanbooru.errors import ConfigError, TrainingError

# --- project.json ---


def _parse(tmp_path, raw):
    from deepdanbooru.project.config import parse_config

    return parse_config(raw, tmp_path, tmp_path / "project.json")


def test_both_keys_default_to_off_and_read_their_values(tmp_path):
    config = _parse(tmp_path, {})
    assert config.weight_decay_toward is None and config.known_head_rate is None
    config = _parse(tmp_path, {"optimizer": "adamw", "weight_decay_toward": "start", "known_head_rate": 0.25})
    assert config.weight_decay_toward == "start" and config.known_head_rate == 0.25
    assert _parse(tmp_path, {"optimizer": "lamb", "weight_decay_toward": "zero"}).weight_decay_toward == "zero"
    assert _parse(tmp_path, {"known_head_rate": 0}).known_head_rate == 0.0


@pytest.mark.parametrize("raw, key", [
    ({"optimizer": "adamw", "weight_decay_toward": "source"}, "weight_decay_toward"),
    ({"optimizer": "adamw", "weight_decay_toward": 1}, "weight_decay_toward"),
    ({"optimizer": "adam", "weight_decay_toward": "start"}, "weight_decay_toward"),  # adam has no decay to pull
    ({"known_head_rate": -0.5}, "known_head_rate"),
    ({"known_head_rate": "slow"}, "known_head_rate"),
])
def test_bad_values_are_one_line_naming_project_json_and_the_key(tmp_path, raw, key):
    with pytest.raises(ConfigError) as error:
        _parse(tmp_path, raw)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'project.json'}: {key}") and "\n" not in message


# --- the optimizer's hooks ---


def _variable_and_optimizer(weight_decay=0.5, rate=0.1):
    import keras

    from deepdanbooru.models.optimizers import make_optimizer

    variable = keras.Variable(np.array([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]], dtype="float32"))
    optimizer = make_optimizer("adamw", rate, weight_decay=weight_decay)
    optimizer.build([variable])
    return variable, optimizer


def _step(optimizer, variable, gradient):
    import tensorflow as tf

    optimizer.apply_gradients([(tf.constant(gradient, dtype=tf.float32), variable)])
    return np.asarray(variable)


def test_decay_pulls_toward_the_target_and_a_row_factor_scales_the_whole_step():
    import tensorflow as tf

    zero = np.zeros((2, 3), dtype="float32")  # Adam's own step is 0: the decay alone moves the weights
    variable, optimizer = _variable_and_optimizer()
    before = np.asarray(variable).copy()
    np.testing.assert_allclose(_step(optimizer, variable, zero), before - 0.1 * 0.5 * before, rtol=1e-6)

    variable, optimizer = _variable_and_optimizer()
    target = tf.constant([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    optimizer.set_decay_targets([(variable, lambda: target)])
    np.testing.assert_allclose(_step(optimizer, variable, zero), before - 0.05 * (before - target.numpy()), rtol=1e-6)

    # A row factor: columns 0 and 2 move a quarter as far, decay and Adam's step alike; column 1 as before.
    gradient = np.array([[0.3, -0.1, 0.2], [-0.4, 0.5, 0.1]], dtype="float32")
    variable, optimizer = _variable_and_optimizer()
    full = _step(optimizer, variable, gradient) - before
    variable, optimizer = _variable_and_optimizer()
    factor = tf.constant([0.25, 1.0, 0.25])
    optimizer.set_row_factors([(variable, lambda: factor)])
    np.testing.assert_allclose(_step(optimizer, variable, gradient) - before, full * factor.numpy(), rtol=1e-5,
                               atol=1e-7)



@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_the_anchor_decays_known_head_columns_and_the_trunk_toward_the_start_and_new_columns_toward_zero(policy):
    """Under mixed_float16 the step goes through the LossScaleOptimizer that wraps the inner optimizer the anchor
    hooks (training.step), and acts the same."""
    import keras
    import tensorflow as tf

    from deepdanbooru.models.optimizers import make_optimizer
    from deepdanbooru.training.anchor import SourceAnchor
    from deepdanbooru.training.wise import StartWeights

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = head_model(2)
        assert model.get_layer("head").kernel.dtype == "float32"
        assert model.get_layer("head").compute_dtype == ("float16" if policy == "mixed_float16" else "float32")
        biases = [model.get_layer(name).bias for name in ("conv", "head")]
        optimizer = make_optimizer("adamw", 0.1, weight_decay=1.0, decay_exempt_variables=biases)
        stepper = keras.optimizers.LossScaleOptimizer(optimizer) if policy == "mixed_float16" else optimizer
        stepper.build(model.trainable_variables)
        start = StartWeights(model, ())
        SourceAnchor(model, optimizer, start, known=[0, 2], toward_start=True, head_rate=0.5)
        begun = by_name(model)
        model.set_weights([w + 1.0 for w in model.get_weights()])  # trained away from the start
        moved = by_name(model)
        stepper.apply_gradients([(tf.zeros_like(w), w) for w in model.trainable_variables])
        now = by_name(model)
    finally:
        keras.mixed_precision.set_global_policy(before)
    kernel, bias, conv = "head/kernel", "head/bias", "conv/kernel"
    # rate 0.1 x decay 1: a tenth of the way toward the target, the known columns half as far (known_head_rate)
    np.testing.assert_allclose(now[conv], moved[conv] - 0.1 * (moved[conv] - begun[conv]), rtol=1e-5)
    expected = moved[kernel].copy()
    expected[:, [0, 2]] -= 0.5 * 0.1 * (moved[kernel][:, [0, 2]] - begun[kernel][:, [0, 2]])
    expected[:, 1] -= 0.1 * moved[kernel][:, 1]
    np.testing.assert_allclose(now[kernel], expected, rtol=1e-5)
    np.testing.assert_array_equal(now[bias], moved[bias])  # biases are not decayed, as before


def test_without_a_source_each_key_says_what_it_does_instead():
    from types import SimpleNamespace

    from deepdanbooru.training.keeping import start_weights as keeping

    config = SimpleNamespace(wise_ft=None, source_distillation=None, weight_decay_toward="start", known_head_rate=0.5,
                             config_path="p/project.json")
    lines = []
    assert keeping(SimpleNamespace(config=config, source_model=None), None, None, None, None, None,
                   lines.append) == (None, None, None)
    assert lines == [
        "notice: weight_decay_toward in p/project.json pulls toward a --source-model's weights; this run starts "
        "from no source, so weight decay pulls toward zero",
        "notice: known_head_rate in p/project.json slows the head's rows of the tags a --source-model knows; this "
        "run starts from no source, so every row learns at the full rate"]
    config.weight_decay_toward, config.known_head_rate = "zero", None
    assert keeping(SimpleNamespace(config=config, source_model=None), *[None] * 5, lines.append) == (None, None, None)
    assert len(lines) == 2


def test_a_checkpoint_written_without_the_anchor_is_refused_in_one_line(tmp_path):
    import tensorflow as tf

    from deepdanbooru.training.wise import check_resumable

    wise = tf.train.Checkpoint(x=tf.Variable(1.0), start_weights=tf.Module())
    wise.start_weights.v = tf.Variable([1.0])
    wise_path = wise.write(str(tmp_path / "wise"))
    anchored = tf.train.Checkpoint(x=tf.Variable(1.0), start_weights=wise.start_weights, source_anchor=tf.Module())
    anchored.source_anchor.known = tf.Variable([1.0])
    anchored_path = anchored.write(str(tmp_path / "anchored"))
    raw = {"optimizer": "adamw", "weight_decay_toward": "start", "known_head_rate": 0.5}
    check_resumable(anchored_path, _parse(tmp_path, raw))
    check_resumable(wise_path, _parse(tmp_path, {"optimizer": "adamw", "weight_decay_toward": "zero"}))
    for key in ("weight_decay_toward", "known_head_rate"):
        with pytest.raises(TrainingError) as error:
            check_resumable(wise_path, _parse(tmp_path, {"optimizer": "adamw", key: raw[key]}))
        assert str(error.value).startswith(f"{tmp_path / 'project.json'}: {key}: {wise_path} was written without {key}")


# --- in a run ---

ANCHOR = dict(epoch_count=1, validation_fraction=0.5, trainable_blocks=2, checkpoint_frequency_mb=1,
              export_model_per_epoch=1, optimizer="adamw", weight_decay=50.0, weight_decay_toward="start")


def _head_names(weights, tags):
    """The head's kernel and bias (resnet_small's is a 1x1 convolution): the kernel whose last axis is the tags'."""
    kernel = [name for name, value in weights.items() if name.endswith("kernel") and value.shape[-1] == tags]
    assert len(kernel) == 1
    return kernel[0], kernel[0][:-len("kernel")] + "bias"


@pytest.mark.slow
def test_an_anchored_run_stopped_and_resumed_ends_as_one_that_never_stopped(tmp_path, sample_dataset, source):  # noqa: F811
    """With EMA, trainable_blocks and wise_ft; the time limit's stop, then a resume without --source-model (the
    start and the known tags from the checkpoint)."""
    from deepdanbooru.training.train import train_project

    keys = dict(ANCHOR, known_head_rate=0.0, ema_decay=0.5, wise_ft=[0.5, 1.0])
    reference = make_project(tmp_path / "reference", *sample_dataset, **keys)
    train_project(reference, source_model=source, echo=lambda *_: None)
    chained = make_project(tmp_path / "chained", *sample_dataset, **keys)
    train_project(chained, source_model=source, echo=lambda *_: None, time_limit=1e-3)  # one slice, then stop
    assert (chained / "model-resnet_small.stopped.keras").is_file()
    train_project(chained, echo=lambda *_: None)
    expected, got = weights_of(reference / "model-resnet_small.e1.keras"), weights_of(chained / "model-resnet_small.e1.keras")
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)

    # known_head_rate 0: the head's columns of the tags the source knows (the first eight) stay the source's, the
    # others learn; the first stages stay the source's (trainable_blocks 2).
    start = by_name(start_weights(reference, source))
    kernel, bias = _head_names(start, len(sample_dataset[1]))
    # (the export holds the moving average of ema_decay: equal to float rounding)
    np.testing.assert_allclose(expected[kernel][..., :8], start[kernel][..., :8], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(expected[bias][:8], start[bias][:8], rtol=1e-6, atol=1e-7)
    assert not np.allclose(expected[kernel][..., 8:], start[kernel][..., 8:], rtol=1e-3, atol=1e-5)
    for name, value in expected.items():
        if name.startswith(("stage1", "stage2")):
            np.testing.assert_array_equal(value, start[name], err_msg=name)


@pytest.mark.slow
def test_decay_toward_the_start_meets_freeze_backbone_epochs(tmp_path, sample_dataset, source):  # noqa: F811
    """The trunk frozen for the first epoch is not decayed; from the second it trains and is pulled toward the
    start, and ends nearer it than the same run decayed toward zero."""
    from deepdanbooru.training.train import train_project

    common = dict(ANCHOR, epoch_count=2, trainable_blocks=None, checkpoint_frequency_mb=3, freeze_backbone_epochs=1)
    anchored = make_project(tmp_path / "anchored", *sample_dataset, **common)
    plain = make_project(tmp_path / "plain", *sample_dataset, **dict(common, weight_decay_toward=None))
    for project in (anchored, plain):
        train_project(project, source_model=source, echo=lambda *_: None)
    start = by_name(start_weights(anchored, source))
    first = weights_of(anchored / "model-resnet_small.e1.keras")
    head, _ = _head_names(start, len(sample_dataset[1]))
    trunk = [name for name, value in start.items() if value.ndim == 4 and name != head]
    assert trunk
    for name in trunk:
        np.testing.assert_array_equal(first[name], start[name], err_msg=name)  # frozen in epoch 1
    toward_start, toward_zero = weights_of(anchored / "model-resnet_small.e2.keras"), \
        weights_of(plain / "model-resnet_small.e2.keras")

    def distance(weights):
        return sum(float(np.sum((weights[name] - start[name]) ** 2)) for name in trunk)

    assert 0 < distance(toward_start) < distance(toward_zero)
