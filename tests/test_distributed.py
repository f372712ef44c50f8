"""tf.distribute: strategy choice, cluster roles, sharding, and real multi-process / multi-device runs on the CPU.

The slow tests train one tiny project (a two-conv source model, 24 images of
32x32 of which 3 are unreadable, global batch 4, three slices of two steps)
four ways: one process (the reference), two worker processes on 127.0.0.1,
MirroredStrategy over two logical CPU devices, and two workers of which one
is killed and both restarted.

Tolerance: a replicated run computes each replica's half batch on its own
and sums the halves (gradients and batch-norm moments) across replicas, so
float rounding differs from one device. Measured here the weights end within
2.4e-7 of the reference; TOLERANCE is 1e-5. Real mistakes move them by far
more (measured): unsynchronized batch normalization 0.03, gradients summed
twice (Keras's own reduction left on) 0.07. The project uses SGD because
Adam's update does not depend on the gradient's scale, which would hide
gradients summed twice, and turns rounding in near-zero gradients into steps
of the size of the learning rate (resnet_small with Adam: 1.7e-3 apart).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from train_helpers import cli_env, make_project, train_command, weights

from deepdanbooru.cli import main
from deepdanbooru.errors import ConfigError, TrainingError
from deepdanbooru.runstate.cluster import ClusterRole, DeviceChoice, cluster_role, parse_devices
from deepdanbooru.training.data import shard_offsets

TOLERANCE = 1e-5
DISTRIBUTED = {"epoch_count": 1, "optimizer": "sgd", "learning_rate": 0.1, "max_bad_image_fraction": 0.4}
FINAL = "model-resnet_small.keras"


def tf_config(ports, index, chief=False) -> str:
    addresses = [f"127.0.0.1:{port}" for port in ports]
    cluster = {"chief": addresses[:1], "worker": addresses[1:]} if chief else {"worker": addresses}
    task = ({"type": "chief", "index": 0} if index == 0 else {"type": "worker", "index": index - 1}) if chief \
        else {"type": "worker", "index": index}
    return json.dumps({"cluster": cluster, "task": task})


# --- TF_CONFIG, --devices, sharding: no TensorFlow process needed ---

def test_no_tf_config_is_a_lone_chief():
    role = cluster_role({})
    assert role == ClusterRole() and not role.in_cluster and role.is_chief


def test_worker_zero_is_the_chief_without_a_chief_task():
    roles = [cluster_role({"TF_CONFIG": tf_config([1000, 1001], i)}) for i in range(2)]
    assert [(r.is_chief, r.worker_number, r.workers, r.address) for r in roles] == [
        (True, 0, 2, "127.0.0.1:1000"), (False, 1, 2, "127.0.0.1:1001")]
    assert roles[1].address_of("worker", 0) == "127.0.0.1:1000"


def test_a_chief_task_is_number_zero_and_workers_follow():
    roles = [cluster_role({"TF_CONFIG": tf_config([1000, 1001, 1002], i, chief=True)}) for i in range(3)]
    assert [(r.task_type, r.task_index, r.is_chief, r.worker_number) for r in roles] == [
        ("chief", 0, True, 0), ("worker", 0, False, 1), ("worker", 1, False, 2)]
    assert "task worker:1 (a worker, 127.0.0.1:1002) of 3" == roles[2].describe()


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     "task type(s) ps in \"cluster\" are not supported"),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}}', "index 2 is not in 0..1"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}', "\"task\" must be"),
    ('{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}', "a:1 appear more than once"),
    ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "non-empty lists"),
])
def test_malformed_tf_config_is_refused(text, message):
    with pytest.raises(ConfigError, match="^TF_CONFIG: ") as error:
        cluster_role({"TF_CONFIG": text})
    assert message in str(error.value)


@pytest.mark.parametrize("spec, gpus", [(None, None), ("all", None), ("CPU", ()), ("1,0", (0, 1)),
                                        ("GPU:2", (2,)), ("/device:GPU:0, gpu:1", (0, 1))])
def test_devices_option(spec, gpus):
    assert parse_devices(spec) == DeviceChoice(gpus)


@pytest.mark.parametrize("spec", ["two", "0,0", "-1"])
def test_bad_devices_option_fails_before_tensorflow(spec, sample_project):
    result = CliRunner().invoke(main, ["train-project", str(sample_project), "--devices", spec])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --devices: {spec!r} ")


def test_bad_tf_config_fails_with_one_line(sample_project, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}')
    result = CliRunner().invoke(main, ["train-project", str(sample_project)])
    assert result.exit_code == 2
    assert result.output == "error: TF_CONFIG: \"task\" index 3 is not in 0..0 for the 1 worker address(es) of " \
                            "\"cluster\"\n"
    assert not (sample_project / ".train.lock").exists()


def test_each_worker_reads_its_part_of_every_global_batch():
    # 10 records, global batch 4 over 2 workers: batches [0-3] [4-7] [8,9]; each worker takes 2 of each.
    parts = [shard_offsets(10, 4, 2, worker).tolist() for worker in range(2)]
    assert parts == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7]]
    four = [shard_offsets(24, 8, 4, worker) for worker in range(4)]
    assert sorted(np.concatenate(four).tolist()) == list(range(24))


def test_workers_that_see_another_setup_are_refused():
    from deepdanbooru.training.sharding import check_same_setup

    mine = {"the training records (...)": 11.0, "project.json settings": 22.0}
    role = cluster_role({"TF_CONFIG": tf_config([1000, 1001, 1002], 0)})

    def sums_with(other_rows):  # what the all-reduce returns: this worker's row plus the others'
        return lambda vector: vector + np.concatenate([[0.0, 0.0], *other_rows])

    check_same_setup(sums_with([[11.0, 22.0], [11.0, 22.0]]), role, mine)
    with pytest.raises(TrainingError) as error:
        check_same_setup(sums_with([[11.0, 22.0], [12.0, 22.0]]), role, mine)
    assert "do not train the same setup as the chief (worker:2 (127.0.0.1:1002): the training records (...))" \
        in str(error.value)


def test_replicated_runs_turn_onednn_off_before_tensorflow_loads():
    from deepdanbooru.runstate.cluster import prepare_tensorflow

    lone, cluster, split = {}, {}, {"DEEPDANBOORU_LOGICAL_CPUS": "2"}
    prepare_tensorflow(ClusterRole(), lone)
    prepare_tensorflow(cluster_role({"TF_CONFIG": tf_config([1000, 1001], 1)}), cluster)
    prepare_tensorflow(ClusterRole(), split)
    assert lone == {} and cluster["TF_ENABLE_ONEDNN_OPTS"] == "0" == split["TF_ENABLE_ONEDNN_OPTS"]


# --- the strategy module in this (single-device) process ---

def test_one_device_start_line():
    import tensorflow as tf

    from deepdanbooru.training.strategy import choose_strategy, describe_strategy

    strategy = choose_strategy(DeviceChoice(), ClusterRole())
    assert strategy is tf.distribute.get_strategy()
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU"
    assert describe_strategy(strategy, ClusterRole(), 32) == f"Devices: one device ({device}); batch 32"
    # Grappler's rewrites cost seconds of the first step and gain nothing on a CPU; with a GPU they stay.
    options = tf.config.optimizer.get_experimental_options()
    assert options.get("disable_meta_optimizer", False) is (device == "CPU")


class _Replicas:
    def __init__(self, count):
        self.num_replicas_in_sync = count


def test_global_batch_must_split_over_the_replicas(tmp_path):
    from deepdanbooru.training.strategy import check_global_batch

    assert check_global_batch(_Replicas(2), 4, tmp_path / "project.json") == 2
    with pytest.raises(ConfigError, match=r"project.json: minibatch_size: 32 does not split evenly over 3 replicas; "
                                          r"use a multiple of 3, e.g. 30 or 33"):
        check_global_batch(_Replicas(3), 32, tmp_path / "project.json")
    with pytest.raises(ConfigError, match="e.g. 4$"):
        check_global_batch(_Replicas(4), 2, tmp_path / "project.json")


def test_lost_peer_becomes_one_training_error(tmp_path):
    import tensorflow as tf

    from deepdanbooru.training.strategy import cluster_failures

    role = cluster_role({"TF_CONFIG": tf_config([1000, 1001], 0)})
    message = ("{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/device:CPU:0}} "
               "Collective ops is aborted by: The following tasks are unhealthy (stopped sending heartbeats): "
               "/job:worker/replica:0/task:1")
    with pytest.raises(TrainingError) as error:
        with cluster_failures(role, tmp_path / "checkpoints"):
            raise tf.errors.UnavailableError(None, None, message)
    text = str(error.value)
    assert text.startswith("TF_CONFIG: task worker:0 (the chief, 127.0.0.1:1000) of 2: lost contact with "
                           "worker:1 (127.0.0.1:1001), so the whole cluster stops (UnavailableError: Collective ops")
    assert "function_node" not in text and text.endswith(f"latest checkpoint in {tmp_path / 'checkpoints'}")
    with pytest.raises(tf.errors.UnavailableError):  # outside a cluster it is not ours to explain
        with cluster_failures(ClusterRole(), tmp_path):
            raise tf.errors.UnavailableError(None, None, message)


def test_exports_carry_unsynchronized_batch_norm(tmp_path):
    import keras

    from deepdanbooru.training.export import export_model
    from deepdanbooru.training.strategy import portable_batch_norm

    inputs = keras.Input((4, 4, 3))
    model = keras.Model(inputs, keras.layers.BatchNormalization(synchronized=True)(inputs))
    export_model(model, tmp_path / "m.keras", float32_copy=tmp_path / "m.float32.keras")
    for name in ("m.keras", "m.float32.keras"):
        assert not keras.models.load_model(tmp_path / name).layers[1].synchronized
    assert model.layers[1].synchronized  # restored for training
    with portable_batch_norm(model):
        assert not model.layers[1].synchronized


def test_worker_checkpoints_are_numbered_like_the_chief_and_leave_nothing(tmp_path):
    import tensorflow as tf

    from deepdanbooru.training.chief import WorkerCheckpoints

    checkpoint = tf.train.Checkpoint(value=tf.Variable(1.0))
    tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=3).save()  # as the chief did: ckpt-1
    before = set(os.listdir(tempfile.gettempdir()))
    worker = WorkerCheckpoints(tf.train.Checkpoint(value=tf.Variable(0.0)), tmp_path, None, write_private=True)
    worker.checkpoint.restore(str(tmp_path / "ckpt-1"))
    assert worker.save() == str(tmp_path / "ckpt-2") == worker.latest_checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-1.data-00000-of-00001",
                                                          "ckpt-1.index"]
    assert set(os.listdir(tempfile.gettempdir())) == before


# --- real runs ---

def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _start_cluster(project, source, ports) -> list[subprocess.Popen]:
    return [subprocess.Popen(train_command(project, "--source-model", str(source)),
                             env=dict(cli_env(), TF_CONFIG=tf_config(ports, index)), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for index in range(len(ports))]


def _finish(processes) -> list[tuple[int, str, str]]:
    try:
        outputs = [p.communicate() for p in processes]
        return [(p.returncode, *output) for p, output in zip(processes, outputs)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def _figures(out: str) -> list[str]:
    """Progress lines without the samples/s and what follows."""
    return [line.split(" samples/s")[0].rsplit(" ", 1)[0] for line in out.splitlines() if line.startswith("epoch ")]


def _files(project) -> list[str]:
    return sorted(str(p.relative_to(project)) for p in project.rglob("*") if "events.out" not in p.name
                  and p.name != "project.json")


def _max_difference(a, b) -> float:
    left, right = weights(a), weights(b)
    assert [x.shape for x in left] == [y.shape for y in right]
    return max(float(np.abs(x - y).max()) for x, y in zip(left, right))


def _tiny_source_model(path, n_tags: int):
    """Two conv + batch-norm layers: what distribution changes, at a fraction of resnet_small's trace time."""
    import keras

    keras.utils.set_random_seed(7)
    inputs = keras.Input((32, 32, 3))
    x = inputs
    for filters in (8, 16):
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(n_tags, activation="sigmoid")(x)
    keras.Model(inputs, outputs).save(path)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, sample_dataset):
    """(database, tags, [paths]): the sample dataset with the images at epoch positions 5-7 emptied.

    They end the first slice's second global batch, so every run trains it as
    record 4 alone: one process as a batch of one; two logical devices as
    record 4 on the first and an empty batch on the second; two workers as
    record 4 from worker 0 while worker 1, whose part was 6-7, has run out.
    The runs thus cover empty replicas and still train the same batches.
    """
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.training.schedule import epoch_order

    database, tags = sample_dataset
    copy = tmp_path_factory.mktemp("dataset") / "data"
    shutil.copytree(database.parent, copy)
    records = load_records(copy / database.name, 1, ("png", "jpg", "jpeg"))
    order = epoch_order(len(records), 0, 0)
    bad = [Path(records.paths()[order[position]]) for position in (5, 6, 7)]
    for path in bad:
        path.write_bytes(b"")
    return copy / database.name, tags, bad


@pytest.fixture(scope="module")
def reference(tmp_path_factory, dataset):
    """(source model, one-process project): the run every distributed run is compared with."""
    from deepdanbooru.training.train import train_project

    root = tmp_path_factory.mktemp("distributed")
    source = _tiny_source_model(root / "source.keras", len(dataset[1]))
    project = make_project(root / "single", *dataset[:2], **DISTRIBUTED)
    train_project(project, source_model=source, echo=lambda *_: None)
    return source, project


@pytest.fixture(scope="module")
def two_workers(reference, tmp_path_factory, dataset):
    """Two worker processes on 127.0.0.1 trained together: (project, [(returncode, stdout, stderr)] by worker)."""
    source, _ = reference
    project = make_project(tmp_path_factory.mktemp("two_workers") / "project", *dataset[:2], **DISTRIBUTED)
    return project, _finish(_start_cluster(project, source, _free_ports(2)))


@pytest.mark.slow
def test_two_workers_train_like_one_process(reference, two_workers, dataset):
    _, single = reference
    project, results = two_workers
    for code, out, err in results:
        assert code == 0, out[-2000:] + err[-2000:]
        assert "Training complete: 1 epoch(s), 6 steps, 21 samples" in out
    chief, worker = (out for _, out, _ in results)
    assert re.search(r"Devices: MultiWorkerMirroredStrategy: 2 worker\(s\) x 1 device\(s\) \(CPU:0\) = 2 replicas; "
                     r"this process is task worker:0 \(the chief, 127\.0\.0\.1:\d+\) of 2; global batch 4 = 2 per "
                     r"replica", chief)
    assert "this process is task worker:1 (a worker, " in worker
    # Every worker walked the same six steps and printed the same (all-reduced) loss and counts.
    assert len(_figures(chief)) == 6 and _figures(chief) == _figures(worker)
    assert "Exported" in chief and "Exported" not in worker
    # The chief alone wrote into the project, and what a single process writes.
    assert _files(project) == _files(single)
    bad_lines = (project / "logs" / "bad_images.txt").read_text().splitlines()
    assert bad_lines == (single / "logs" / "bad_images.txt").read_text().splitlines()
    assert bad_lines == [f"epoch 1\t{position}\t{path}\tempty file (0 bytes)"
                         for position, path in zip((5, 6, 7), dataset[2])]
    # Both say that the slice lost three pictures; the chief, which logs them, names them too.
    named = ", ".join(f"{path} (empty file (0 bytes))" for path in dataset[2])
    for out, which in ((chief, f": {named}; "), (worker, "; ")):
        assert re.search(r"warning: 3 pictures of records 0\.\.\d+ in epoch 1 could not be read and were skipped"
                         + re.escape(which), out), out[-3000:]
    assert _max_difference(single / FINAL, project / FINAL) < TOLERANCE


@pytest.mark.slow
def test_two_logical_devices_train_like_one(reference, tmp_path, dataset):
    source, single = reference
    project = make_project(tmp_path / "mirrored", *dataset[:2], **DISTRIBUTED)
    result = subprocess.run(train_command(project, "--source-model", str(source)), capture_output=True, text=True,
                            env=dict(cli_env(), DEEPDANBOORU_LOGICAL_CPUS="2"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Devices: MirroredStrategy: 2 replicas (CPU:0, CPU:1); global batch 4 = 2 per replica" in result.stdout
    assert _max_difference(single / FINAL, project / FINAL) < TOLERANCE


@pytest.mark.slow
def test_killed_worker_stops_the_cluster_and_a_restart_resumes(reference, two_workers, tmp_path, dataset):
    source, _ = reference
    uninterrupted, _ = two_workers
    project = make_project(tmp_path / "killed", *dataset[:2], **DISTRIBUTED)
    ports = _free_ports(2)
    chief, worker = _start_cluster(project, source, ports)
    try:
        for line in worker.stdout:
            if line.startswith("Checkpoint"):  # the first slice is saved; the chief cannot pass the next step
                worker.kill()
                break
        chief_out, chief_err = chief.communicate()
    finally:
        for process in (chief, worker):
            if process.poll() is None:
                process.kill()
        worker.communicate()
    assert chief.returncode == 2, chief_out[-2000:] + chief_err[-2000:]
    assert "Training complete" not in chief_out and "Traceback" not in chief_err
    errors = [line for line in chief_err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: TF_CONFIG: task worker:0 (the chief, 127.0.0.1:{ports[0]}) of 2: lost contact with worker:1 "
        f"(127.0.0.1:{ports[1]}), so the whole cluster stops (UnavailableError: ")
    assert errors[0].endswith(f"training resumes from the chief's latest checkpoint in {project / 'checkpoints'}")
    assert not (project / ".train.lock").exists() and not (project / FINAL).exists()

    results = _finish(_start_cluster(project, source, _free_ports(2)))
    for code, out, err in results:
        assert code == 0, out[-2000:] + err[-2000:]
        assert f"Resuming from {project / 'checkpoints' / 'ckpt-1'}: used_epoch=0 used_minibatch=2 used_sample=5 " \
               "offset=8 random_seed=0" in out  # 5: three bad images
    # Resuming is exact: the same weights as the cluster that was never interrupted.
    assert _max_difference(uninterrupted / FINAL, project / FINAL) == 0.0


@pytest.mark.slow
def test_time_limit_on_the_chief_stops_every_worker_at_the_same_slice(reference, tmp_path, dataset):
    source, _ = reference
    project = make_project(tmp_path / "limited", *dataset[:2], **DISTRIBUTED)
    ports = _free_ports(2)
    # Only the chief has a limit (1 s: up after the first slice); the worker must stop with it, not wait.
    processes = [subprocess.Popen(train_command(project, "--source-model", str(source), *extra),
                                  env=dict(cli_env(), TF_CONFIG=tf_config(ports, index)), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for index, extra in enumerate([("--time-limit", "1s"), ()])]
    results = _finish(processes)
    for code, out, err in results:
        assert code == 0, out[-2000:] + err[-2000:]
        assert "Stopped for the time limit" in out and "at epoch 1/1, record 8/24, step 2" in out
        assert "Training complete" not in out
    chief_out, worker_out = (out for _, out, _ in results)
    assert "Exported" in chief_out and "Exported" not in worker_out
    assert json.loads((project / "checkpoints" / "state.json").read_text())["offset"] == 8
    assert (project / "model-resnet_small.stopped.keras").exists() and not (project / FINAL).exists()
