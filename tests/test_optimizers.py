"""The fused Adam / SGD updates against Keras's own update_step."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from deepdanbooru.models import make_optimizer
from deepdanbooru.models.optimizers import FusedAdam, FusedSGD

SHAPES = [(3, 4), (4,), (2, 2, 3, 5)]
STEPS = 6
TOLERANCE = {"rtol": 3e-5, "atol": 1e-6}


def _variables():
    rng = np.random.default_rng(1)
    return [keras.Variable(rng.normal(size=shape).astype(np.float32), name=f"w{i}") for i, shape in enumerate(SHAPES)]


def _gradients(step):
    rng = np.random.default_rng(100 + step)
    return [tf.constant(rng.normal(size=shape).astype(np.float32)) for shape in SHAPES]


def _train(optimizer, compiled):
    variables = _variables()
    optimizer.build(variables)

    def apply(gradients):
        optimizer.apply_gradients(zip(gradients, variables))

    if compiled:
        apply = tf.function(apply)
    for step in range(STEPS):
        apply(_gradients(step))
    return [v.numpy() for v in variables], [v.numpy() for v in optimizer.variables]


PAIRS = {
    "adam": (lambda: FusedAdam(learning_rate=0.01), lambda: keras.optimizers.Adam(learning_rate=0.01)),
    "sgd": (lambda: FusedSGD(learning_rate=0.05, momentum=0.9, nesterov=True),
            lambda: keras.optimizers.SGD(learning_rate=0.05, momentum=0.9, nesterov=True)),
    "sgd-plain-momentum": (lambda: FusedSGD(learning_rate=0.05, momentum=0.9),
                           lambda: keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)),
    "adam-clipped": (lambda: FusedAdam(learning_rate=0.01, global_clipnorm=0.5),
                     lambda: keras.optimizers.Adam(learning_rate=0.01, global_clipnorm=0.5)),
}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("name", list(PAIRS))
def test_fused_update_matches_keras(name, compiled):
    fused, reference = PAIRS[name]
    weights, slots = _train(fused(), compiled)
    expected_weights, expected_slots = _train(reference(), compiled)
    initial = [v.numpy() for v in _variables()]
    assert not any(np.array_equal(a, b) for a, b in zip(weights, initial))  # it did train
    assert len(slots) == len(expected_slots)
    # The kernels compute 1 - beta in float32 (1 - 0.999f = 0.00099999), Keras rounds it from float64
    # (0.001): a 1.3e-5 relative difference in the velocity's decay, nothing more. A wrong formula (bias
    # correction, Nesterov term, learning rate) is off by 1e-3 or more.
    for got, want in zip(weights + slots, expected_weights + expected_slots):
        np.testing.assert_allclose(got, want, **TOLERANCE)


def test_registry_gives_the_fused_classes():
    assert isinstance(make_optimizer("adam", 0.001), FusedAdam)
    sgd = make_optimizer("sgd", 0.01)
    assert isinstance(sgd, FusedSGD) and sgd.nesterov and sgd.momentum == 0.9


def _graph_ops(optimizer):
    variables = _variables()
    optimizer.build(variables)
    function = tf.function(lambda gradients: optimizer.apply_gradients(zip(gradients, variables)))
    graph = function.get_concrete_function([tf.TensorSpec(shape, tf.float32) for shape in SHAPES]).graph
    return len(graph.get_operations())


def test_fused_graph_is_much_smaller():
    fused, reference = _graph_ops(FusedAdam(0.01)), _graph_ops(keras.optimizers.Adam(0.01))
    # Per variable, Keras traces ~40 ops; the fused path one kernel plus a handful of reads.
    assert fused * 2 < reference, (fused, reference)


def test_amsgrad_falls_back_to_keras_exactly():
    weights, slots = _train(FusedAdam(learning_rate=0.01, amsgrad=True), compiled=False)
    expected_weights, expected_slots = _train(keras.optimizers.Adam(learning_rate=0.01, amsgrad=True),
                                              compiled=False)
    for got, want in zip(weights + slots, expected_weights + expected_slots):
        np.testing.assert_array_equal(got, want)


def test_checkpoints_are_interchangeable_with_keras_adam(tmp_path):
    """A checkpoint written with keras.optimizers.Adam (before the fused class existed) restores into it."""
    variables = _variables()
    old = keras.optimizers.Adam(learning_rate=0.01)
    old.build(variables)
    for step in range(2):
        old.apply_gradients(zip(_gradients(step), variables))
    path = tf.train.Checkpoint(optimizer=old, weights=variables).save(str(tmp_path / "ckpt"))

    restored_variables = _variables()
    new = FusedAdam(learning_rate=0.01)
    new.build(restored_variables)
    tf.train.Checkpoint(optimizer=new, weights=restored_variables).restore(path).assert_consumed()
    assert int(new.iterations.numpy()) == 2
    for got, want in zip(new.variables, old.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # And both continue the same way from there.
    for step in range(2, 4):
        old.apply_gradients(zip(_gradients(step), variables))
        new.apply_gradients(zip(_gradients(step), restored_variables))
    for got, want in zip(restored_variables, variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOLERANCE)


def test_loss_scale_optimizer_skips_overflowing_steps():
    variables = _variables()
    optimizer = keras.optimizers.LossScaleOptimizer(FusedAdam(learning_rate=0.01))
    optimizer.build(variables)
    before = [v.numpy() for v in variables]
    gradients = _gradients(0)
    gradients[1] = tf.constant(np.full(SHAPES[1], np.inf, np.float32))
    optimizer.apply_gradients(zip(gradients, variables))
    for got, want in zip(variables, before):
        np.testing.assert_array_equal(got.numpy(), want)
    optimizer.apply_gradients(zip(_gradients(1), variables))
    assert not np.array_equal(variables[0].numpy(), before[0])
