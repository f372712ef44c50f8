"""The one place that chooses the tf.distribute strategy, and what replication changes in the math.

    TF_CONFIG describes a cluster        -> MultiWorkerMirroredStrategy (every local GPU, or the CPU)
    more than one GPU visible            -> MirroredStrategy over them (--devices picks which)
    DEEPDANBOORU_LOGICAL_CPUS=N (tests)  -> MirroredStrategy over N logical CPU devices (no cluster)
    otherwise                            -> the default strategy (one device)

`minibatch_size` is the global batch whatever the replica count, and a
replicated run computes what one device would, up to float rounding:

- batch normalization is synchronized across replicas, so its statistics
  are those of the global batch (exports are written with the layers'
  plain, unsynchronized config, so they load on any backend);
- gradients are summed across replicas *before* the optimizer sees them,
  so gradient clipping and the loss-scale optimizer's overflow check act on
  the global gradient. Keras's own per-replica reduction, which runs after
  clipping, is switched off for the optimizers we build.

The strategy must exist before TensorFlow initialises its runtime:
collective ops and logical devices cannot be configured afterwards.
"""

from __future__ import annotations

import contextlib
import re
import warnings

import keras
import tensorflow as tf

from deepdanbooru import compat, hardware
from deepdanbooru.errors import ConfigError, TrainingError, file_field, tf_message_text
from deepdanbooru.tfruntime import tune_graph_optimizer
from deepdanbooru.runstate.cluster import LOGICAL_CPUS_ENV, ClusterRole, DeviceChoice, cluster_role, logical_cpus

_SUM = tf.distribute.ReduceOp.SUM
# One strategy per settings and process: TensorFlow cannot build a second MultiWorkerMirroredStrategy.
_chosen: dict = {}


def _select_gpus(choice: DeviceChoice) -> None:
    if choice.gpus is None:
        return
    physical = tf.config.list_physical_devices("GPU")
    missing = [index for index in choice.gpus if index >= len(physical)]
    if missing:
        visible = ", ".join(str(i) for i in range(len(physical))) or "none"
        raise TrainingError(file_field("--devices", None, f"GPU {missing[0]} is not visible (visible GPUs: "
                                                          f"{visible})"))
    try:
        tf.config.set_visible_devices([physical[index] for index in choice.gpus], "GPU")
    except RuntimeError:
        if [d.name for d in tf.config.get_visible_devices("GPU")] != [physical[i].name for i in choice.gpus]:
            raise TrainingError(file_field("--devices", None, "TensorFlow was already initialised in this "
                                                              "process with other devices")) from None


def _split_cpu(count: int) -> list[str]:
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # already initialised: usable only if it was split the same way, checked below
    names = [device.name for device in tf.config.list_logical_devices("CPU")]
    if len(names) != count:
        raise TrainingError(file_field(LOGICAL_CPUS_ENV, None, f"asks for {count} logical CPUs, but TensorFlow "
                                                               f"was already initialised with {len(names)}"))
    return names


def choose_strategy(devices: DeviceChoice | None = None, role: ClusterRole | None = None) -> tf.distribute.Strategy:
    """The strategy for this process; the same object on every call with the same settings.

    The first call must come before anything starts TensorFlow's runtime
    (creating a variable or a tensor does): see the module docstring.
    """
    key = (devices or DeviceChoice(), cluster_role() if role is None else role, logical_cpus())
    if key not in _chosen:
        _chosen[key] = _create_strategy(*key)
        tune_graph_optimizer()
    return _chosen[key]


def _create_strategy(devices: DeviceChoice, role: ClusterRole, cpus: int) -> tf.distribute.Strategy:
    _select_gpus(devices)
    if role.in_cluster:
        # Blocks until every task of TF_CONFIG has started (there is no timeout). Logical CPUs are not
        # split here: listing them would start the runtime, after which collectives cannot be configured.
        return tf.distribute.MultiWorkerMirroredStrategy()
    cpu_names = _split_cpu(cpus) if cpus > 1 else []
    gpus = [device.name for device in tf.config.list_logical_devices("GPU")]
    if not gpus and devices.gpus is None:
        _note_unused_gpu()
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy(gpus)
    if cpu_names and not gpus:
        return tf.distribute.MirroredStrategy(cpu_names)
    return tf.distribute.get_strategy()


def _note_unused_gpu() -> None:
    """One line when the driver shows a GPU that TensorFlow did not find (not silent CPU training)."""
    note = hardware.unused_gpu_note(hardware.find_gpus())
    if note:
        warnings.warn(note, stacklevel=2)


def replicas(strategy: tf.distribute.Strategy) -> int:
    return int(strategy.num_replicas_in_sync)


def check_global_batch(strategy: tf.distribute.Strategy, batch_size: int, config_path) -> int:
    """The per-replica batch; minibatch_size must split evenly, or replicas would idle or run unequal halves."""
    count = replicas(strategy)
    if batch_size % count:
        lower, upper = batch_size - batch_size % count, batch_size + count - batch_size % count
        options = f"{lower} or {upper}" if lower else str(upper)
        raise ConfigError(file_field(config_path, "minibatch_size", f"{batch_size} does not split evenly over "
                                     f"{count} replicas; use a multiple of {count}, e.g. {options}"))
    return batch_size // count


def describe_strategy(strategy: tf.distribute.Strategy, role: ClusterRole, batch_size: int) -> str:
    """The start-up line: strategy, replica count, global and per-replica batch."""
    count = replicas(strategy)
    if isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy, tf.distribute.MirroredStrategy)):
        local = [device.split("/")[-1].replace("device:", "") for device in strategy.extended.worker_devices]
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            where = (f"MultiWorkerMirroredStrategy: {role.workers} worker(s) x {len(local)} device(s) "
                     f"({', '.join(local)}) = {count} replicas; this process is {role.describe()}")
        else:
            where = f"MirroredStrategy: {count} replicas ({', '.join(local)})"
        return f"Devices: {where}; global batch {batch_size} = {batch_size // count} per replica"
    gpus = tf.config.list_logical_devices("GPU")
    return f"Devices: one device ({gpus[0].name.replace('/device:', '') if gpus else 'CPU'}); batch {batch_size}"


def _batch_norm_layers(layer):
    for child in getattr(layer, "layers", []):
        if isinstance(child, keras.layers.BatchNormalization):
            yield child
        yield from _batch_norm_layers(child)


def synchronize_batch_norm(model: keras.Model, strategy: tf.distribute.Strategy) -> int:
    """With several replicas, make batch normalization use global-batch statistics; returns the layers changed."""
    if replicas(strategy) < 2:
        return 0
    layers = list(_batch_norm_layers(model))
    for layer in layers:
        layer.synchronized = True
    return len(layers)


@contextlib.contextmanager
def portable_batch_norm(model: keras.Model):
    """Serialize `model` with unsynchronized batch normalization (other backends reject synchronized=True)."""
    changed = [layer for layer in _batch_norm_layers(model) if layer.synchronized]
    for layer in changed:
        layer.synchronized = False
    try:
        yield model
    finally:
        for layer in changed:
            layer.synchronized = True


def take_over_gradient_reduction(optimizer, strategy: tf.distribute.Strategy) -> None:
    """Stop Keras from summing gradients across replicas: `sum_across_replicas` has done it, before clipping."""
    if replicas(strategy) < 2:
        return
    compat.keep_gradients_unreduced(getattr(optimizer, "inner_optimizer", optimizer))


def sum_across_replicas(gradients: list) -> list:
    """In a replica context: the global gradient on every replica (None entries stay None)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync < 2:
        return list(gradients)
    present = [index for index, gradient in enumerate(gradients) if gradient is not None]
    reduced = context.all_reduce(_SUM, [gradients[index] for index in present])
    result = list(gradients)
    for index, gradient in zip(present, reduced):
        result[index] = gradient
    return result


# Raised by collective ops when a peer is gone or stops answering.
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError,
                 tf.errors.AbortedError)


def _peers_named(message: str, role: ClusterRole) -> list[str]:
    """The other tasks a TensorFlow error names (/job:worker/replica:0/task:1), with their TF_CONFIG addresses."""
    names = []
    for kind, index in re.findall(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", message):
        if (kind, int(index)) == (role.task_type, role.task_index):
            continue
        name = f"{kind}:{index} ({role.address_of(kind, int(index)) or 'address unknown'})"
        if name not in names:
            names.append(name)
    return names


@contextlib.contextmanager
def cluster_failures(role: ClusterRole, checkpoints):
    """Turn a lost peer into one TrainingError line that says who and how to resume."""
    try:
        yield
    except PEER_FAILURES as error:
        if not role.in_cluster:
            raise
        message = str(getattr(error, "message", error))
        detail = tf_message_text(message)[:300]
        peers = _peers_named(message, role)
        lost = f"lost contact with {', '.join(peers)}" if peers else "lost contact with another task"
        raise TrainingError(file_field(
            "TF_CONFIG", None,
            f"{role.describe()}: {lost}, so the whole cluster stops ({type(error).__name__}: {detail}). "
            f"Restart every task with the same TF_CONFIG; training resumes from the chief's latest checkpoint "
            f"in {checkpoints}")) from None
