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
import tensorflow as tf

from deepdanbooru.errors import DependencyError

SAVING_LIB = "keras.src.saving.saving_lib"
OPS_PACKAGE = "keras.src.ops"
# TensorFlow's reader of one TFRecord record at a byte offset, which checks both of the record's CRC32Cs.
RECORD_IO = "tensorflow.python.lib.io._pywrap_record_io"
# TensorFlow's eager context, whose coordination service (which MultiWorkerMirroredStrategy starts) holds barriers.
EAGER_CONTEXT = "tensorflow.python.eager.context"


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


# --- the per-variable update: fused kernels, per-variable learning rates ---

class FusedUpdate:
    """Mix into a Keras optimizer: each variable's learning rate times its own factor, and a fused kernel.

    `set_rate_factors(pairs)` ((variable, factor) pairs, before the first step; absent variables keep 1):
    each listed variable's step and decoupled weight decay use learning_rate * factor, as a parameter
    group's rate does in timm or torch. With none set, Keras's own arithmetic runs untouched.
    Keras hands each replica's (gradient, variable) pairs to `fused_update(distribution, grads_and_vars,
    learning_rate)`; when that returns False, Keras's own update_step runs instead.

    Two more hooks, both off unless set (before the first step): `set_decay_targets(pairs)` ((variable,
    target) pairs, target a callable giving a tensor of the variable's shape): the decoupled decay of each
    listed variable pulls it toward target() instead of zero, var -= (var - target) * weight_decay * rate.
    `set_row_factors(pairs)` ((variable, factor) pairs, factor a callable giving a tensor that broadcasts
    against the variable): each listed variable moves factor times as far as the step (decay included)
    would move it, element by element, whatever the optimizer's arithmetic.
    """

    def __init__(self, *args, **kwargs):
        for name in ("_distributed_tf_update_step", "_apply_weight_decay", "_use_weight_decay"):
            _require(keras.optimizers.Optimizer, name, f"Optimizer.{name}")
        super().__init__(*args, **kwargs)
        self._rates = _RateFactors(())
        self._targets = _RateFactors(())
        self._rows = _RateFactors(())

    def fused_update(self, distribution, grads_and_vars, learning_rate) -> bool:
        return False

    def set_rate_factors(self, pairs) -> None:
        self._rates = _RateFactors(pairs)

    def set_decay_targets(self, pairs) -> None:
        self._targets = _RateFactors(pairs)

    def set_row_factors(self, pairs) -> None:
        self._rows = _RateFactors(pairs)

    @property
    def rate_factors(self) -> tuple:
        return self._rates.pairs

    @property
    def _decays_each(self) -> bool:
        """Whether decay runs per variable inside the update (_decay_each) rather than as Keras's own pass."""
        return bool(self._rates.pairs or self._targets.pairs or self._rows.pairs)

    def _listed(self, table, variable):
        """`variable`'s entry of a pairs table (set_decay_targets, set_row_factors), or None."""
        if not table.pairs:
            return None
        if table.by_index is None:  # the optimizer's indices exist once it is built
            table.by_index = {variable_index(self, var): value for var, value in table.pairs}
        return table.by_index.get(variable_index(self, variable))

    def rate_for(self, variable, learning_rate):
        """learning_rate times `variable`'s factor; exactly `learning_rate` (no op added) at factor 1."""
        rates = self._rates
        if not rates.pairs:
            return learning_rate
        if rates.by_index is None:  # the optimizer's indices exist once it is built
            rates.by_index = {variable_index(self, var): factor for var, factor in rates.pairs}
        factor = rates.by_index.get(variable_index(self, variable), 1.0)
        return learning_rate if factor == 1.0 else learning_rate * factor

    def update_step(self, gradient, variable, learning_rate):
        # Every Keras update_step is linear in its learning_rate, weight decay aside (handled below).
        return super().update_step(gradient, variable, self.rate_for(variable, learning_rate))

    def _apply_weight_decay(self, variables):
        if not self._decays_each:
            super()._apply_weight_decay(variables)
        # Otherwise each variable decays at its own rate just before its update (_distributed_tf_update_step).

    def _decay_each(self, distribution, grads_and_vars, learning_rate):
        """Keras's decoupled decay, var -= (var - target) * weight_decay * rate, at each variable's rate, toward
        its target (set_decay_targets) or zero."""
        for _, var in grads_and_vars:
            if not self._use_weight_decay(var):
                continue
            rate = self.rate_for(var, learning_rate)
            target = self._listed(self._targets, var)

            def decay(variable, rate=rate, target=target):
                pull = variable if target is None else variable - tf.cast(target(), variable.dtype)
                variable.assign_sub(pull * tf.cast(self.weight_decay, variable.dtype) * tf.cast(rate, variable.dtype))

            distribution.extended.update(var, decay, group=False)

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        grads_and_vars = list(grads_and_vars)
        rows = [(var, factor) for _, var in grads_and_vars
                if (factor := self._listed(self._rows, var)) is not None]
        before = [tf.identity(var) for var, _ in rows]
        if self._decays_each and self.weight_decay is not None:
            self._decay_each(distribution, grads_and_vars, learning_rate)
        if not self.fused_update(distribution, grads_and_vars, learning_rate):
            super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)
        for (var, factor), was in zip(rows, before):

            def scale(variable, was, factor=factor):
                variable.assign(was + tf.cast(factor(), variable.dtype) * (variable - was))

            distribution.extended.update(var, scale, args=(was,), group=False)
        return None


class _RateFactors:
    """A plain object, not a list or dict: Keras's attribute tracking would put those in every checkpoint."""

    def __init__(self, pairs):
        self.pairs = tuple(pairs)
        self.by_index = None


def variable_index(optimizer, variable) -> int:
    """The optimizer's index of `variable` (a keras.Variable, its tf.Variable, or a replica's copy)."""
    return _require(optimizer, "_get_variable_index", "Optimizer._get_variable_index")(variable)


def slot_variables(optimizer, variable, slot_lists: tuple[str, ...]) -> tuple:
    """The optimizer's slot variables for `variable` (e.g. Adam's "_momentums", "_velocities"), in that order."""
    index = variable_index(optimizer, variable)
    return tuple(_require(optimizer, name, f"{type(optimizer).__name__}.{name}")[index].value
                 for name in slot_lists)


# --- replaying keras.applications: which serialized entries are op nodes, not layers ---

def is_op_node(entry: dict) -> bool:
    """Whether a functional model's serialized layer entry is a `keras.ops` call rather than a layer.

    Keras records only the defining module of each entry, and its ops live in a private package;
    if that package moved, every op node would silently be taken for a layer, so its absence stops here.
    """
    try:
        importlib.import_module(OPS_PACKAGE)
    except ImportError:
        raise _missing(OPS_PACKAGE) from None
    module = entry.get("module") or ""
    return module == OPS_PACKAGE or module.startswith(OPS_PACKAGE + ".")


# --- packed shards: one TFRecord record at an offset, checked ---

def checked_record_reader(path):
    """A reader of the TFRecord file at `path`: `.read(offset)` -> (record bytes, next offset).

    `offset` is where the record's framing starts. TensorFlow checks the CRC32C of the length and of the
    bytes, and raises tf.errors.DataLossError for a damaged record (OutOfRangeError past the end).
    """
    try:
        module = importlib.import_module(RECORD_IO)
    except ImportError:
        module = None
    if module is None or not hasattr(module, "RandomRecordReader"):
        raise DependencyError(f"tensorflow {tf.__version__}: {RECORD_IO}.RandomRecordReader is gone; deepdanbooru "
                              "needs the TensorFlow version pinned in its pyproject.toml to read packed shards")
    return module.RandomRecordReader(str(path))


# --- a cluster: every task waits for the others before it leaves ---

def wait_for_every_task(barrier: str, timeout_seconds: float) -> None:
    """Block until every task of the cluster has called this with the same `barrier` name.

    A collective ends on one task as soon as its own part has arrived, while a peer may still be pulling
    the last piece from it; a task that left then would close the socket under that peer. The barrier
    is answered by the coordination service only once every task has arrived, so a task that passes it
    knows every peer is done with all the collectives before it. A peer that died or never comes raises
    (tf.errors.UnavailableError or DeadlineExceededError) instead of waiting for ever.
    """
    try:
        module = importlib.import_module(EAGER_CONTEXT)
    except ImportError:
        module = None
    context = module.context() if module is not None and hasattr(module, "context") else None
    if context is None or not hasattr(context, "wait_at_barrier"):
        raise DependencyError(f"tensorflow {tf.__version__}: {EAGER_CONTEXT}.Context.wait_at_barrier is gone; "
                              "deepdanbooru needs the TensorFlow version pinned in its pyproject.toml to train "
                              "in a cluster")
    context.wait_at_barrier(barrier, int(timeout_seconds * 1000))


# Checked by tests/test_compat.py against the installed Keras (and TensorFlow): (where, attribute).
ADAM_SLOTS = ("_momentums", "_velocities")
PRIVATE_NAMES = (
    (SAVING_LIB, "is_memory_sufficient"),
    (OPS_PACKAGE, "Operation"),
    ("keras.optimizers.Optimizer", "_all_reduce_sum_gradients"),
    ("keras.optimizers.Optimizer", "_distributed_tf_update_step"),
    ("keras.optimizers.Optimizer", "_get_variable_index"),
    ("keras.optimizers.Optimizer", "_apply_weight_decay"),
    ("keras.optimizers.Optimizer", "_use_weight_decay"),
    *(("keras.optimizers.Adam (built)", name) for name in ADAM_SLOTS),
    (RECORD_IO, "RandomRecordReader"),
    (EAGER_CONTEXT + ".Context", "wait_at_barrier"),
)
