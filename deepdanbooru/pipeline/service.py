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
resumes from the last checkpoint and remakes that slice exactly. The
trainer never waits for ever: the service's output is read on a thread of
its own and the trainer gives up when no batch came for STALL_SECONDS or
when --time-limit runs out. A slice ends when its last batch is in, without
waiting for the service to end the job: a dead worker stays in every later
job (measured with TensorFlow 2.21, even after the dispatcher timed it out),
so those jobs never end, while the live workers make all their batches.
"""

from __future__ import annotations

import errno
import math
import queue
import socket
import threading
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
# No batch at all from the service for this long means it stalled (no live worker, a hung worker or
# dispatcher); a batch normally takes well under a second, a slice's first one a few seconds of set-up.
STALL_SECONDS = 120.0
# Our dispatcher logs a worker that sent no heartbeat for this long as lost and looks for such workers (and
# for jobs whose trainer is gone) every second instead of every 10 minutes; our workers send a heartbeat
# every second instead of every 30 s. TensorFlow 2.21 still gives the lost worker a task of each new job,
# which is why in_order does not wait for a job's end.
WORKER_TIMEOUT_MS = 10_000
_CHECK_INTERVAL_MS = 1_000
_HEARTBEAT_MS = 1_000
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


def service_batches(columns: dict, batching, batch_size: int, address: str,
                    deadline: float | None = None) -> tf.data.Dataset:
    """The batches of one slice (`columns`: path, position, tags tensors in epoch order), made by the service;
    waiting for one ends at `deadline` (time.monotonic(), the end of --time-limit) or after a stall."""
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
    return tf.data.Dataset.from_generator(lambda: in_order(remote, batch_count, deadline=deadline),
                                          output_signature=spec)


def in_order(batches, batch_count: int, window: int = REORDER_WINDOW, stall: float = STALL_SECONDS,
             deadline: float | None = None):
    """Yield the batches of `batches` (each with its index under "batch") in index order, empty ones left out.

    Fails with one line when a batch is lost: later ones fill the window, the service ends without it, no
    batch arrives for `stall` seconds, or `deadline` (time.monotonic()) passes while waiting."""
    pending = {}
    expected = 0
    try:
        for batch in _arrivals(batches, stall, deadline):
            batch = dict(batch)
            pending[int(batch.pop("batch"))] = batch
            while expected in pending:
                ready = pending.pop(expected)
                expected += 1
                if int(np.shape(ready["position"])[0]):
                    yield ready
            if expected == batch_count:
                # Every batch is here. The service's end of the job is not awaited: a worker that died, even
                # before this job, keeps it open (TensorFlow 2.21 gives it a task of every job), for ever.
                return
            if len(pending) > window:
                raise DataServiceError(_lost(expected, batch_count, f"{len(pending)} later batches arrived first"))
    except _Late as late:
        raise DataServiceError(_lost(expected, batch_count, str(late))) from None
    if expected < batch_count:
        raise DataServiceError(_lost(expected, batch_count, "the service ended the slice without it"))


class _Late(Exception):
    """No batch came in time; the message says which wait ran out."""


_END = object()


def _arrivals(batches, stall: float, deadline: float | None):
    """The items of `batches`, each waited for at most `stall` seconds and never past `deadline`.

    TensorFlow's data-service reader waits for a lost worker without a time limit and cannot be
    interrupted, so it runs on a daemon thread that hands each item over. When a wait runs out, or the
    slice ends before the service ends its job, that thread stays blocked until the service answers
    (never, while a dead worker keeps the job open): one idle thread per such slice. A daemon thread
    does not hold up the interpreter's exit, and the CLI leaves without joining threads anyway."""
    handoff = queue.Queue(maxsize=1)
    abandoned = threading.Event()

    def hand_over(item) -> bool:
        while not abandoned.is_set():
            try:
                handoff.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def read():
        try:
            for batch in batches:
                if not hand_over((batch, None)):
                    return
            hand_over((_END, None))
        except Exception as error:  # any failure of the reader is raised again on the trainer's side
            hand_over((None, error))

    threading.Thread(target=read, name="data-service batches", daemon=True).start()
    try:
        while True:
            wait, why = stall, f"no batch at all came for {stall:g} s"
            if deadline is not None and deadline - time.monotonic() < stall:
                wait, why = deadline - time.monotonic(), "--time-limit ran out while waiting for it"
            try:
                batch, error = handoff.get(timeout=max(wait, 0.0))
            except queue.Empty:
                raise _Late(why) from None
            if error is not None:
                raise error
            if batch is _END:
                return
            yield batch
    finally:
        abandoned.set()


def _lost(index: int, batch_count: int, why: str) -> str:
    return file_field(WHERE, "data_service", (
        f"batch {index} of {batch_count} of this slice never came ({why}): a data-service worker stopped "
        f"mid-slice, or none is running. Running train-project again resumes at the last checkpoint and "
        f"remakes the slice exactly"))


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


def _port_taken(port: int) -> DataServiceError:
    return DataServiceError(f"--port {port}: the port is in use on this host (a data-service server or another "
                            f"program listens on it); stop that one or choose another --port")


def check_port_free(port: int) -> None:
    """Fail with one line if something listens on `port` here. gRPC binds with SO_REUSEPORT, so a second
    dispatcher on a dispatcher's port would start silently and share it; this probe binds without it."""
    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Lets a port left in TIME_WAIT by a server just stopped count as free, but never one with a listener.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise _port_taken(port) from None
            raise DataServiceError(f"--port {port}: cannot listen on it ({error.strerror or error})") from None


def _start(port: int, server_class, config):
    """The server, or one line when its port was taken after the check (gRPC says only 'Could not start')."""
    try:
        return server_class(config)
    except RuntimeError as error:
        if "Could not start gRPC server" not in str(error):
            raise
        raise _port_taken(port) from None


def serve(role: str, *, port: int, dispatcher: str | None = None, host: str | None = None, echo=print) -> None:
    """Run a dispatcher or a worker until Ctrl-C."""
    name = host or socket.gethostname()
    check_port_free(port)
    if role == "dispatcher":
        server = _start(port, _SERVICE.DispatchServer, _SERVICE.DispatcherConfig(
            port=port, worker_timeout_ms=WORKER_TIMEOUT_MS, job_gc_check_interval_ms=_CHECK_INTERVAL_MS))
        bound = server.target.rsplit(":", 1)[1]
        echo(f"data-service dispatcher listening on port {bound}; set \"data_service\": \"{name}:{bound}\" in "
             f"project.json and start workers with `deepdanbooru data-service worker --dispatcher {name}:{bound}`")
    else:
        check_reachable(dispatcher, "--dispatcher")
        server = _start(port, _SERVICE.WorkerServer, _SERVICE.WorkerConfig(
            dispatcher_address=dispatcher.removeprefix("grpc://"), worker_address=f"{name}:%port%", port=port,
            heartbeat_interval_ms=_HEARTBEAT_MS))
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
