"""The private Keras names of deepdanbooru.compat exist in the installed Keras, and their guards say so when not."""

import importlib
import re
import tomllib
from pathlib import Path

import keras
import tensorflow as tf
import numpy as np
import pytest

from deepdanbooru import compat
from deepdanbooru.errors import DependencyError


def _owner(where: str):
    if where.startswith("keras.optimizers.Adam"):
        optimizer = keras.optimizers.Adam()
        optimizer.build([keras.Variable(np.zeros(2, np.float32))])
        return optimizer
    module, _, name = where.rpartition(".")
    if where in (compat.SAVING_LIB, compat.OPS_PACKAGE, compat.RECORD_IO):
        return importlib.import_module(where)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("where, name", compat.PRIVATE_NAMES)
def test_every_private_name_exists_in_the_installed_keras(where, name):
    assert hasattr(_owner(where), name), f"keras {keras.__version__} has no {where}.{name}"


def test_keras_is_pinned_to_the_installed_minor_version():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("keras"))
    low, high = re.fullmatch(r"keras>=(\d+\.\d+),<(\d+\.\d+)", pin).groups()
    installed = ".".join(keras.__version__.split(".")[:2])
    assert low == installed and int(high.split(".")[1]) == int(installed.split(".")[1]) + 1


def test_a_missing_name_stops_with_one_line_naming_the_keras_version():
    class Bare:
        pass

    with pytest.raises(DependencyError) as error:
        compat.keep_gradients_unreduced(Bare())
    message = str(error.value)
    assert message.startswith(f"keras {keras.__version__}: Optimizer._all_reduce_sum_gradients is gone")
    assert "\n" not in message


def test_missing_saving_switch_is_refused_not_skipped(monkeypatch):
    saving_lib = importlib.import_module(compat.SAVING_LIB)
    monkeypatch.delattr(saving_lib, "is_memory_sufficient")
    with pytest.raises(DependencyError, match="saving_lib.is_memory_sufficient is gone"):
        with compat.weights_staged_on_disk():
            pass


def test_slot_variables_follow_the_variable_index():
    optimizer = keras.optimizers.Adam()
    first, second = keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(3, np.float32))
    optimizer.build([first, second])
    momentum, velocity = compat.slot_variables(optimizer, second, compat.ADAM_SLOTS)
    assert tuple(momentum.shape) == tuple(velocity.shape) == (3,)


def test_op_nodes_are_told_from_layers_in_a_serialized_model():
    image = keras.Input((4,), name="image")
    dense = keras.layers.Dense(4, name="dense")(image)
    model = keras.Model(image, keras.ops.add(dense, image))
    entries = {entry["name"]: entry for entry in model.get_config()["layers"]}
    ops = [name for name, entry in entries.items() if compat.is_op_node(entry)]
    assert len(ops) == 1 and entries[ops[0]]["class_name"] == "Add"
    assert not compat.is_op_node(entries["dense"]) and not compat.is_op_node(entries["image"])


def test_missing_ops_package_is_refused(monkeypatch):
    entry = {"module": compat.OPS_PACKAGE + ".numpy"}
    monkeypatch.setattr(compat, "OPS_PACKAGE", compat.OPS_PACKAGE + "_moved")
    with pytest.raises(DependencyError, match="ops_moved is gone"):
        compat.is_op_node(entry)


def test_missing_cluster_barrier_is_refused(monkeypatch):
    context = importlib.import_module(compat.EAGER_CONTEXT)
    monkeypatch.delattr(context.Context, "wait_at_barrier")
    with pytest.raises(DependencyError) as error:
        compat.wait_for_every_task("end", 1.0)
    message = str(error.value)
    assert message.startswith(f"tensorflow {tf.__version__}: tensorflow.python.eager.context.Context.wait_at_barrier "
                              "is gone") and "\n" not in message


def test_the_barrier_outside_a_cluster_fails_instead_of_waiting():
    # A lone process has no coordination service: the call must raise, never block (the trainer calls it in a
    # cluster only).
    with pytest.raises(tf.errors.FailedPreconditionError, match="Coordination service is not enabled"):
        compat.wait_for_every_task("alone", 1.0)
