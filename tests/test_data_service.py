"""Training input made by tf.data service workers: the local pipeline's batches, in its order, and clear failures."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from train_helpers import assert_same_weights, checkpoint_prefixes, cli_env, make_project, read_state

tf = pytest.importorskip("tensorflow")

from deepdanbooru.cli import main  # noqa: E402
from deepdanbooru.errors import ConfigError  # noqa: E402
from deepdanbooru.pipeline import Augmentation, TrainingInput, training_dataset  # noqa: E402
from deepdanbooru.pipeline.service import (  # noqa: E402
    DataServiceError,
    ServiceErrors,
    check_port_free,
    check_reachable,
    in_order,
)
from deepdanbooru.project.config import load_config  # noqa: E402

TAGS = ["a", "b", "c"]
SERVICE = tf.data.experimental.service


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _batch(index, positions):
    return {"batch": np.int64(index), "position": np.asarray(positions, np.int64),
            "image": np.full((len(positions), 2), float(index), np.float32)}


def test_batches_come_out_in_index_order_whatever_order_the_workers_send_them():
    arrived = [_batch(2, [8, 9]), _batch(0, [0, 1, 2, 3]), _batch(3, []), _batch(1, [4, 6, 7]), _batch(4, [16])]
    out = list(in_order(arrived, 5))
    # Batch 3 lost every image: it arrives as an empty placeholder and is left out, without a wait.
    assert [list(batch["position"]) for batch in out] == [[0, 1, 2, 3], [4, 6, 7], [8, 9], [16]]
    assert all("batch" not in batch for batch in out)


def test_a_batch_that_never_comes_stops_the_slice_with_one_line():
    with pytest.raises(DataServiceError, match=r"data_service: batch 1 of 3 of this slice never came .*resumes"):
        list(in_order([_batch(0, [0]), _batch(2, [2])], 3))
    later = [_batch(index, [index]) for index in range(1, 6)]
    with pytest.raises(DataServiceError, match=r"batch 0 of 9 .*\(4 later batches arrived first\)"):
        list(in_order(later, 9, window=3))


def _then_nothing(arrived, release):
    """The batches in `arrived`, then a wait that never ends by itself (a worker that died holding the next)."""
    yield from arrived
    release.wait()


@pytest.mark.parametrize("arrived, total, bound, reason", [
    ([0, 2], 4, {"stall": 0.3}, r"no batch at all came for 0.3 s"),
    ([0], 2, {"deadline": 0.3}, r"--time-limit ran out while waiting for it"),
], ids=["stall-bound", "time-limit-deadline"])
def test_waiting_for_a_missing_batch_ends_with_one_line_naming_it(arrived, total, bound, reason):
    """No batch for the stall bound, or the --time-limit deadline reached, stops the slice at batch 1."""
    if "deadline" in bound:
        bound = {"deadline": time.monotonic() + bound["deadline"]}
    release = threading.Event()
    try:
        batches = in_order(_then_nothing([_batch(index, [index]) for index in arrived], release), total, **bound)
        assert list(next(batches)["position"]) == [0]
        with pytest.raises(DataServiceError, match=rf"^project.json: data_service: batch 1 of {total} of this slice "
                                                   rf"never came \({re.escape(reason)}\): .* resumes"):
            next(batches)
    finally:
        release.set()


def test_an_error_of_the_service_reader_reaches_the_trainer():
    def broken():
        yield _batch(0, [0])
        raise tf.errors.UnavailableError(None, None, "socket closed")

    batches = in_order(broken(), 3)
    next(batches)
    with pytest.raises(tf.errors.UnavailableError, match="socket closed"):
        next(batches)


def test_a_failure_inside_tf_data_is_raised_again_as_its_one_line():
    def broken():
        yield {"position": np.zeros(1, np.int64)}
        list(in_order([], 2))

    dataset = tf.data.Dataset.from_generator(broken, output_signature={"position": tf.TensorSpec([None], tf.int64)})
    wrapped = ServiceErrors(dataset)
    assert wrapped.element_spec == dataset.element_spec
    with pytest.raises(DataServiceError) as raised:
        list(wrapped)
    assert str(raised.value).startswith("project.json: data_service: batch 0 of 2 of this slice never came")
    assert "\n" not in str(raised.value)


def test_no_dispatcher_at_the_address_is_one_line_not_an_endless_retry():
    port = _free_port()
    with pytest.raises(DataServiceError, match=rf"project.json: data_service: no dispatcher answers at "
                                               rf"localhost:{port} .*data-service dispatcher --port {port}"):
        check_reachable(f"localhost:{port}")


def test_data_service_key_defaults_off_and_checks_its_address(tmp_path):
    (tmp_path / "project.json").write_text("{}")
    config = load_config(tmp_path)
    assert config.data_service is None and TrainingInput.from_config(config).data_service is None
    (tmp_path / "project.json").write_text(json.dumps({"data_service": "cpu-a:5050"}))
    assert TrainingInput.from_config(load_config(tmp_path)).data_service == "cpu-a:5050"
    for bad in ("cpu-a", "cpu-a:http", ":5050", 5050):
        (tmp_path / "project.json").write_text(json.dumps({"data_service": bad}))
        with pytest.raises(ConfigError, match=r"project.json: data_service: must be .*HOST:PORT"):
            load_config(tmp_path)


def test_data_service_command_checks_its_options():
    result = CliRunner().invoke(main, ["data-service", "worker"])
    assert result.exit_code == 2 and "a worker needs --dispatcher HOST:PORT" in result.output
    result = CliRunner().invoke(main, ["data-service", "dispatcher", "--dispatcher", "a:1"])
    assert result.exit_code == 2 and "--dispatcher is for workers" in result.output
    port = _free_port()
    result = CliRunner().invoke(main, ["data-service", "worker", "--dispatcher", f"localhost:{port}"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: --dispatcher: no dispatcher answers at localhost:{port} (Connection "
                                     f"refused); start one with `deepdanbooru data-service dispatcher --port "
                                     f"{port}` on localhost")


def _refused(*args) -> subprocess.CompletedProcess:
    """`deepdanbooru data-service ...` expected to exit at once (a server that starts would run until killed)."""
    try:
        return subprocess.run([sys.executable, "-m", "deepdanbooru", "data-service", *args], env=cli_env(),
                              capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"data-service {' '.join(args)} started instead of refusing: {expired.stdout}")


def _port_in_use(port) -> str:
    return (f"error: --port {port}: the port is in use on this host (a data-service server or another program "
            f"listens on it); stop that one or choose another --port")


@pytest.mark.slow
def test_a_second_dispatcher_on_a_dispatcher_s_port_is_refused_in_one_line():
    port = _free_port()
    (dispatcher,) = _start(("dispatcher", "--port", str(port), "--host", "127.0.0.1"))
    try:
        # gRPC listens with SO_REUSEPORT: without the check the second one started and shared the port.
        second = _refused("dispatcher", "--port", str(port))
        assert (second.returncode, second.stdout + second.stderr) == (2, _port_in_use(port) + "\n")
        worker = _refused("worker", "--dispatcher", f"127.0.0.1:{port}", "--port", str(port))
        assert (worker.returncode, worker.stdout + worker.stderr) == (2, _port_in_use(port) + "\n")
    finally:
        _stop(dispatcher)


@pytest.mark.slow
def test_a_port_another_program_listens_on_is_one_line_not_a_grpc_traceback(monkeypatch):
    from deepdanbooru.pipeline import service

    with socket.socket() as other:
        other.bind(("", 0))
        other.listen()
        port = other.getsockname()[1]
        result = _refused("dispatcher", "--port", str(port))
        assert (result.returncode, result.stdout + result.stderr) == (2, _port_in_use(port) + "\n")
        with pytest.raises(DataServiceError, match=rf"^--port {port}: the port is in use"):
            check_port_free(port)
        # Taken between the check and the start: gRPC's own failure becomes the same line.
        monkeypatch.setattr(service, "check_port_free", lambda port: None)
        with pytest.raises(DataServiceError) as raised:
            service.serve("dispatcher", port=port, echo=lambda *_: None)
        assert f"error: {raised.value}" == _port_in_use(port)
    check_port_free(port)  # free again once closed


@pytest.fixture
def images(tmp_path):
    """Eleven PNGs of different sizes (lossless); the eighth is not an image."""
    paths = []
    for index in range(11):
        path = tmp_path / f"{index}.png"
        Image.fromarray(np.random.default_rng(index).integers(
            0, 256, (28 + 2 * index, 40 - index, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    (tmp_path / "7.png").write_bytes(b"not a picture")
    return paths


def _start(*commands):
    """`deepdanbooru data-service ...` subprocesses, started together, once each has printed its first line."""
    # _stop ends them with SIGINT: a child inherits an ignored SIGINT (a test run started in the background of a
    # script ignores it), and Python then never raises KeyboardInterrupt, so the default is restored for it.
    children = [subprocess.Popen([sys.executable, "-m", "deepdanbooru", "data-service", *args], env=cli_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
                for args in commands]
    for child in children:
        first = child.stdout.readline()
        assert "data-service" in first, first + child.stdout.read()
    return children


def _stop(child) -> str:
    child.send_signal(signal.SIGINT)
    output, _ = child.communicate()
    assert child.returncode == 0, output
    return output


@pytest.mark.slow
def test_a_dispatcher_and_two_workers_started_by_the_commands_make_exactly_the_local_batches(images):
    port = _free_port()
    (dispatcher,) = _start(("dispatcher", "--port", str(port), "--host", "127.0.0.1"))
    address = f"127.0.0.1:{port}"
    workers = _start(*[("worker", "--dispatcher", address, "--host", "127.0.0.1")] * 2)
    strings = ["a", "b c", "", "a c", "c"] * 3
    options = TrainingInput(20, 20, Augmentation((0.0, 360.0), (0.9, 1.1), (-0.1, 0.1), True, (0.5, 1.0)), seed=3,
                            batch_size=4, max_image_pixels=10**8, mixup=0.4)
    try:
        readable = images[:7] + images[8:]
        local = list(training_dataset(readable, strings[:10], TAGS, options, random_seed=5, start_position=20))
        served = list(training_dataset(readable, strings[:10], TAGS, dataclasses.replace(options, data_service=address),
                                       random_seed=5, start_position=20))
        assert [list(b["position"].numpy()) for b in served] == [[20, 21, 22, 23], [24, 25, 26, 27], [28, 29]]
        assert len(served) == len(local)
        for here, there in zip(local, served):
            assert sorted(here) == sorted(there) == ["image", "label", "position"]
            for key in here:
                np.testing.assert_array_equal(here[key].numpy(), there[key].numpy())
        # An unreadable image: its batch is one short (not refilled), and its position never arrives; a batch
        # of only unreadable images comes as an empty placeholder, which the trainer never sees.
        bad = images[7]
        paths = readable[:5] + [bad] + readable[5:7] + [bad] * 4 + readable[7:9]
        served = list(training_dataset(paths, strings[:len(paths)], TAGS,
                                       dataclasses.replace(options, data_service=address), random_seed=5,
                                       start_position=0))
        assert [list(b["position"].numpy()) for b in served] == [[0, 1, 2, 3], [4, 6, 7], [12, 13]]
    finally:
        outputs = [_stop(child) for child in [*workers, dispatcher]]
    assert all(output.strip().endswith("stopped") for output in outputs), outputs


@pytest.mark.slow
def test_training_on_the_data_service_gives_the_local_run_s_weights_bit_for_bit(tmp_path, sample_dataset):
    from deepdanbooru.training.train import train_project

    # The servers are left running until this test process ends: each slice's reader thread stays with the
    # service's job (pipeline/service.py), and against a stopped dispatcher it would log a failed heartbeat
    # every second for as long as the process lives.
    dispatcher = SERVICE.DispatchServer(SERVICE.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    _KEPT_SERVERS.extend([dispatcher, *(SERVICE.WorkerServer(SERVICE.WorkerConfig(dispatcher_address=address))
                                        for _ in range(2))])
    # One epoch in two slices of three minibatches, with the recipe's augmentation and mixup.
    settings = dict(epoch_count=1, checkpoint_frequency_mb=3, horizontal_flip=True, mixup=0.4)
    local = make_project(tmp_path / "local", *sample_dataset, **settings)
    served = make_project(tmp_path / "served", *sample_dataset, data_service=address, **settings)
    train_project(local, echo=lambda *_: None)
    train_project(served, echo=lambda *_: None)
    assert_same_weights(local / "model-resnet_small.keras", served / "model-resnet_small.keras")


_KEPT_SERVERS: list = []


def _run(log_path, project, *options):
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "deepdanbooru", "train-project", str(project), *options],
                                env=cli_env(), stdout=log, stderr=subprocess.STDOUT)


def _finished(trainer, log_path, within: float = 240.0) -> tuple[int, str]:
    """(exit code, output) of a train-project run; a run still there after `within` seconds hung (a failure)."""
    try:
        trainer.wait(timeout=within)
    except subprocess.TimeoutExpired:
        trainer.kill()
        trainer.wait()
        pytest.fail(f"train-project still running after {within:g} s:\n{log_path.read_text()}")
    return trainer.returncode, log_path.read_text()


def _one_error(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output
    return errors[0]


@pytest.mark.slow
def test_a_hung_worker_ends_the_run_at_its_time_limit_and_after_a_killed_worker_the_next_run_resumes(tmp_path):
    """A worker stuck on a picture (a FIFO nobody writes, read as an image), then killed -9 and replaced."""
    from deepdanbooru.sample.generator import generate_sample_dataset
    from deepdanbooru.training.schedule import epoch_order
    from deepdanbooru.training.train import plan_training, train_project

    database, tags = generate_sample_dataset(tmp_path / "dataset", count=24, size=32)
    port = _free_port()
    # One epoch of 24 records in two slices of three batches of 4.
    settings = dict(epoch_count=1, checkpoint_frequency_mb=3, export_model_per_epoch=0)
    project = make_project(tmp_path / "served", database, tags, data_service=f"127.0.0.1:{port}", **settings)
    plan = plan_training(project)
    paths = plan.train.paths()
    # The picture at epoch position 17: batch 1 of the second slice.
    stuck = Path(paths[epoch_order(len(paths), plan.config.seed, 0)[17]])
    original = stuck.read_bytes()
    stuck.unlink()
    os.mkfifo(stuck)
    (dispatcher,) = _start(("dispatcher", "--port", str(port), "--host", "127.0.0.1"))
    (worker,) = _start(("worker", "--dispatcher", f"127.0.0.1:{port}", "--host", "127.0.0.1"))
    trainer = replacement = None
    try:
        # 1. The worker hangs opening the picture: the run ends by its time limit, inside the second slice,
        # with the first slice's checkpoint as the last state.
        trainer = _run(tmp_path / "1.log", project, "--time-limit", "60s")
        code, output = _finished(trainer, tmp_path / "1.log")
        assert code == 2 and _one_error(output) == (
            "error: project.json: data_service: batch 1 of 3 of this slice never came (--time-limit ran out while "
            "waiting for it): a data-service worker stopped mid-slice, or none is running. Running train-project "
            "again resumes at the last checkpoint and remakes the slice exactly"), output
        assert read_state(project)["offset"] == 12 and checkpoint_prefixes(project) == ["ckpt-1"]

        # 2. That worker is killed -9 and another one started. TensorFlow keeps the dead worker in every new
        # job, which then never ends; the run still gets every batch from the live worker, resumes from the
        # checkpoint and ends with the weights of a run that never stopped.
        worker.kill()
        worker.wait()
        stuck.unlink()
        stuck.write_bytes(original)
        (replacement,) = _start(("worker", "--dispatcher", f"127.0.0.1:{port}", "--host", "127.0.0.1"))
        trainer = _run(tmp_path / "2.log", project)
        code, output = _finished(trainer, tmp_path / "2.log")
        assert code == 0 and f"Resuming from {project / 'checkpoints' / 'ckpt-1'}" in output, output
    finally:
        for child in (trainer, worker):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
        for child in (replacement, dispatcher):
            if child is not None:
                _stop(child)
        if stuck.is_fifo():
            stuck.unlink()
            stuck.write_bytes(original)
    local = make_project(tmp_path / "local", database, tags, **settings)
    train_project(local, echo=lambda *_: None)
    assert_same_weights(local / "model-resnet_small.keras", project / "model-resnet_small.keras")
