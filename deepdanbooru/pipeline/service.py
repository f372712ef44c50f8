"""Training batches made by tf.data service workers on other CPU hosts, delivered in the local pipeline's order.

When one host's CPUs cannot decode pictures as fast as its GPUs train on them,
the decoding can run on TensorFlow's own tf.data service: a dispatcher and
any number of workers (`deepdanbooru data-service dispatcher|worker`). The
trainer registers the slice's dataset with the dispatcher; the workers run it
and send finished batches.

Same batches, same order. The unit of work is the batch index k of the
slice: batch k is the records at offsets [k*B, (k+1)*B), read, decoded,
augmented and labelled by exactly the local pipeline's batching
(`dataset._batching`). The source is `range(count)`, which the dispatcher
hands out to whichever worker asks next (dynamic sharding: no fixed worker
list, workers may come and go); every worker output carries its k, and the
trainer puts batches back in k order with a bounded reorder buffer. So the
batches, their order and their augmentation are a pure function of the seed
and the positions, whichever worker made which batch; resume stays exact.

One difference from the local pipeline, by design: a batch that loses an
unreadable image is one picture short instead of pulling the next record in
(which would make batch k depend on what another worker found in batch k-1).
With every image readable the batches are identical; either way the missing
positions are what the bad-image accounting sees. A batch of only bad images
arrives as an empty placeholder, so the buffer never waits for it.

Dynamic sharding visits each batch at most once: if a worker stops mid-job,
its batches never come. The trainer then stops with one line; running again
resumes from the last checkpoint and remakes that slice exactly.
"""

from __future__ import annotations

import math
import socket
import time

import numpy as np
import tensorflow as tf

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.project.config import split_address

_SERVICE = tf.data.experimental.service
# Interleaved across workers in any order: the trainer restores the order, so no fixed worker list is needed.
_MODE = _SERVICE.ShardingPolicy.DYNAMIC
# Batches held while an earlier one is still being made. A worker slower than the rest delays only its own
# batches; this many later ones arriving first means it stopped (or is hopelessly slow): fail, don't fill memory.
REORDER_WINDOW = 64
# Batches being made at once on one worker: the next is decoded while the previous one finishes.
_BATCHES_IN_FLIGHT = 2
_MARKER = "data_service:"
DEFAULT_PORT = 5050
WHERE = "project.json"


class DataServiceError(TrainingError):
    """The data service cannot be reached or lost batches of a slice."""


def check_reachable(address: str, where: str = f"{WHERE}: data_service", timeout: float = 10.0) -> None:
    """Fail with one line if nothing listens at the dispatcher's address (TensorFlow would retry for ever)."""
    try:
        host, port = split_address(address)
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except ValueError as error:
        raise DataServiceError(f"{where}: {error}") from None
    except OSError as error:
        raise DataServiceError(
            f"{where}: no dispatcher answers at {host}:{port} ({error.strerror or error}); start one with "
            f"`deepdanbooru data-service dispatcher --port {port}` on {host}") from None


def service_batches(columns: dict, batching, batch_size: int, address: str) -> tf.data.Dataset:
    """The batches of one slice (`columns`: path, position, tags tensors in epoch order), made by the service."""
    check_reachable(address)
    count = int(columns["path"].shape[0])
    batch_count = math.ceil(count / batch_size)

    def one_batch(index):
        low = index * batch_size
        high = tf.minimum(low + batch_size, count)
        made = batching(tf.data.Dataset.from_tensor_slices({name: column[low:high]
                                                             for name, column in columns.items()}))
        empty = tf.nest.map_structure(lambda spec: tf.zeros([0, *spec.shape[1:]], spec.dtype), made.element_spec)
        made = made.concatenate(tf.data.Dataset.from_tensors(empty)).take(1)
        return made.map(lambda batch: {**batch, "batch": index})

    one_batch = tf.autograph.experimental.do_not_convert(one_batch)
    made = tf.data.Dataset.range(batch_count).interleave(
        one_batch, cycle_length=_BATCHES_IN_FLIGHT, num_parallel_calls=_BATCHES_IN_FLIGHT, deterministic=False)
    made = made.prefetch(_BATCHES_IN_FLIGHT)
    # No compression: decompressing on the trainer would spend the CPU time this exists to spare.
    remote = made.apply(_SERVICE.distribute(processing_mode=_MODE, service=f"grpc://{address.removeprefix('grpc://')}",
                                            compression=None, target_workers="ANY"))
    spec = {name: value for name, value in made.element_spec.items() if name != "batch"}
    return tf.data.Dataset.from_generator(lambda: in_order(remote, batch_count), output_signature=spec)


def in_order(batches, batch_count: int, window: int = REORDER_WINDOW):
    """Yield the batches of `batches` (each with its index under "batch") in index order, empty ones left out."""
    pending = {}
    expected = 0
    for batch in batches:
        batch = dict(batch)
        pending[int(batch.pop("batch"))] = batch
        while expected in pending:
            ready = pending.pop(expected)
            expected += 1
            if int(np.shape(ready["position"])[0]):
                yield ready
        if len(pending) > window:
            raise DataServiceError(_lost(expected, batch_count, f"{len(pending)} later batches arrived first"))
    if expected < batch_count:
        raise DataServiceError(_lost(expected, batch_count, "the service ended the slice without it"))


def _lost(index: int, batch_count: int, why: str) -> str:
    return file_field(WHERE, "data_service", (
        f"batch {index} of {batch_count} of this slice never came ({why}): a data-service worker stopped "
        f"mid-slice. Running train-project again resumes at the last checkpoint and remakes the slice exactly"))


class ServiceErrors:
    """A dataset wrapper that turns our own data-service failures, raised inside tf.data, back into one line."""

    def __init__(self, dataset):
        self._dataset = dataset

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def __iter__(self):
        try:
            yield from self._dataset
        except tf.errors.OpError as error:
            message = str(getattr(error, "message", error))
            start = message.find(WHERE + ": " + _MARKER)
            if start < 0:
                raise
            raise DataServiceError(message[start:].splitlines()[0]) from None


def serve(role: str, *, port: int, dispatcher: str | None = None, host: str | None = None, echo=print) -> None:
    """Run a dispatcher or a worker until Ctrl-C."""
    name = host or socket.gethostname()
    if role == "dispatcher":
        server = _SERVICE.DispatchServer(_SERVICE.DispatcherConfig(port=port))
        bound = server.target.rsplit(":", 1)[1]
        echo(f"data-service dispatcher listening on port {bound}; set \"data_service\": \"{name}:{bound}\" in "
             f"project.json and start workers with `deepdanbooru data-service worker --dispatcher {name}:{bound}`")
    else:
        check_reachable(dispatcher, "--dispatcher")
        server = _SERVICE.WorkerServer(_SERVICE.WorkerConfig(
            dispatcher_address=dispatcher.removeprefix("grpc://"), worker_address=f"{name}:%port%", port=port))
        echo(f"data-service worker {name} serving dispatcher {dispatcher}; it reads the images at the paths in "
             f"the trainer's database")
    try:
        # server.join() blocks inside TensorFlow, where Ctrl-C is not seen; a Python sleep is interrupted.
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        echo(f"data-service {role} stopped")
    finally:
        server.stop()
