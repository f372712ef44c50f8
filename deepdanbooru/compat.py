"""Every private Keras name deepdanbooru relies on, each behind a guard.

Keras keeps no promise about these names between minor versions, so
pyproject.toml pins Keras to the minor version they were checked against, and
tests/test_compat.py checks each entry of PRIVATE_NAMES against the installed
Keras. When one is gone, its guard stops with one line naming the Keras
version, instead of training on with a silently different computation.
docs/architecture.md says how to move the pin.
"""

from __future__ import annotations

import contextlib
import importlib

import keras

from deepdanbooru.errors import DependencyError

SAVING_LIB = "keras.src.saving.saving_lib"


def _missing(name: str) -> DependencyError:
    return DependencyError(f"keras {keras.__version__}: {name} is gone; deepdanbooru needs the Keras version "
                           "pinned in its pyproject.toml (reinstall with `pip install -e .`)")


def _require(owner, attribute: str, shown: str):
    if not hasattr(owner, attribute):
        raise _missing(shown)
    return getattr(owner, attribute)


def _saving_lib():
    try:
        return importlib.import_module(SAVING_LIB)
    except ImportError:
        raise _missing(SAVING_LIB) from None


# --- export: where Keras stages the weights file ---

@contextlib.contextmanager
def weights_staged_on_disk():
    """Make Keras write a .keras file's weights to a temporary .h5 beside it, then copy them into the zip.

    Keras 3.15 otherwise builds the whole weights file in memory whenever it judges memory sufficient,
    and copies that buffer once more into the zip: +225 MB of peak memory for resnet_custom_v4's 230 MB
    export, against +12-37 MB staged on disk, in about the same time (docs/performance.md).
    """
    saving_lib = _saving_lib()
    judge = _require(saving_lib, "is_memory_sufficient", f"{SAVING_LIB}.is_memory_sufficient")
    saving_lib.is_memory_sufficient = lambda model: False
    try:
        yield
    finally:
        saving_lib.is_memory_sufficient = judge


# --- distributed training: who sums the gradients over replicas ---

def _pass_through(grads_and_vars):
    return list(grads_and_vars)


def keep_gradients_unreduced(optimizer) -> None:
    """Stop `optimizer` from summing gradients across replicas: the caller sums them itself, before clipping.

    Keras's TensorFlow optimizer sums them after clipping and the loss-scale overflow check; leaving both
    sums in place would multiply every gradient by the replica count.
    """
    _require(optimizer, "_all_reduce_sum_gradients", "Optimizer._all_reduce_sum_gradients")
    optimizer._all_reduce_sum_gradients = _pass_through


# --- fused optimizer kernels: the per-variable update and its slot variables ---

class FusedUpdate:
    """Mix into a Keras optimizer: Keras hands each replica's (gradient, variable) pairs to
    `fused_update(distribution, grads_and_vars, learning_rate)`; when that returns False, Keras's own
    update_step runs instead."""

    def __init__(self, *args, **kwargs):
        _require(keras.optimizers.Optimizer, "_distributed_tf_update_step", "Optimizer._distributed_tf_update_step")
        super().__init__(*args, **kwargs)

    def fused_update(self, distribution, grads_and_vars, learning_rate) -> bool:
        raise NotImplementedError

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        if not self.fused_update(distribution, grads_and_vars, learning_rate):
            return super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)
        return None


def slot_variables(optimizer, variable, slot_lists: tuple[str, ...]) -> tuple:
    """The optimizer's slot variables for `variable` (e.g. Adam's "_momentums", "_velocities"), in that order."""
    index = _require(optimizer, "_get_variable_index", "Optimizer._get_variable_index")(variable)
    return tuple(_require(optimizer, name, f"{type(optimizer).__name__}.{name}")[index].value
                 for name in slot_lists)


# Checked by tests/test_compat.py against the installed Keras: (where, attribute).
ADAM_SLOTS = ("_momentums", "_velocities")
PRIVATE_NAMES = (
    (SAVING_LIB, "is_memory_sufficient"),
    ("keras.optimizers.Optimizer", "_all_reduce_sum_gradients"),
    ("keras.optimizers.Optimizer", "_distributed_tf_update_step"),
    ("keras.optimizers.Optimizer", "_get_variable_index"),
    *(("keras.optimizers.Adam (built)", name) for name in ADAM_SLOTS),
)
