"""Who this process is in a training cluster, and which local devices it may use (standard library only).

Read before TensorFlow is imported, so that train-project knows whether to
take the project lock and write logs (the chief) or only compute (a worker),
and so that a malformed TF_CONFIG or --devices value fails in a fraction of
a second.

TF_CONFIG is TensorFlow's own variable, read by MultiWorkerMirroredStrategy:

    {"cluster": {"chief": ["host0:port"], "worker": ["host1:port", ...]},
     "task": {"type": "worker", "index": 0}}

The chief is task ("chief", 0), or ("worker", 0) when the cluster has no
"chief" entry. Parameter-server and evaluator tasks are not supported: the
loop is synchronous data parallelism.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from deepdanbooru.errors import ConfigError, file_field

TF_CONFIG = "TF_CONFIG"
# Hidden: split the CPU into N logical devices and mirror over them, so tests can exercise
# MirroredStrategy on a machine without GPUs.
LOGICAL_CPUS_ENV = "DEEPDANBOORU_LOGICAL_CPUS"
TRAINING_TASKS = ("chief", "worker")


@dataclass(frozen=True)
class ClusterRole:
    """This process's place in the cluster; `ClusterRole()` is a lone process."""

    task_type: str | None = None
    task_index: int = 0
    workers: int = 1  # training tasks in the cluster: chief + workers
    address: str | None = None
    has_chief_task: bool = False  # the cluster names a "chief" (else worker 0 is the chief)
    tasks: tuple[tuple[str, int, str], ...] = ()  # (type, index, address) of every task

    def address_of(self, task_type: str, index: int) -> str | None:
        return next((address for kind, i, address in self.tasks if (kind, i) == (task_type, index)), None)

    @property
    def in_cluster(self) -> bool:
        return self.task_type is not None

    @property
    def is_chief(self) -> bool:
        return not self.in_cluster or self.worker_number == 0

    @property
    def worker_number(self) -> int:
        """0 for the chief, then the workers in TF_CONFIG order (TensorFlow's task id order)."""
        if self.task_type == "worker" and self.has_chief_task:
            return self.task_index + 1
        return self.task_index

    def describe(self) -> str:
        if not self.in_cluster:
            return "single process"
        role = "the chief" if self.is_chief else "a worker"
        return f"task {self.task_type}:{self.task_index} ({role}, {self.address}) of {self.workers}"


def _fail(message: str) -> ConfigError:
    return ConfigError(file_field(TF_CONFIG, None, message))


def cluster_role(environ=None) -> ClusterRole:
    """Parse TF_CONFIG; no (or an empty) TF_CONFIG means a lone process."""
    text = (os.environ if environ is None else environ).get(TF_CONFIG, "").strip()
    if not text:
        return ClusterRole()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(f"not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(config, dict):
        raise _fail("must be a JSON object with \"cluster\" and \"task\"")
    cluster, task = config.get("cluster"), config.get("task")
    if not cluster:
        # TensorFlow treats a TF_CONFIG without a cluster as no cluster too.
        return ClusterRole()
    if not isinstance(cluster, dict) or not all(
            isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts)
            for hosts in cluster.values()):
        raise _fail("\"cluster\" must map task types to non-empty lists of \"host:port\" strings")
    unsupported = sorted(set(cluster) - set(TRAINING_TASKS))
    if unsupported:
        raise _fail(f"task type(s) {', '.join(unsupported)} in \"cluster\" are not supported; train-project runs "
                    "synchronous data parallelism with \"chief\" and \"worker\" tasks only")
    if len(cluster.get("chief", [])) > 1:
        raise _fail("\"cluster\" may name one \"chief\" at most")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise _fail(f"\"task\" must be {{\"type\": one of {sorted(cluster)}, \"index\": N}}, got {task!r}")
    index = task.get("index", 0)
    hosts = cluster[task["type"]]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(hosts):
        raise _fail(f"\"task\" index {index!r} is not in 0..{len(hosts) - 1} for the {len(hosts)} "
                    f"{task['type']} address(es) of \"cluster\"")
    addresses = [address for kind in TRAINING_TASKS for address in cluster.get(kind, [])]
    duplicates = sorted({address for address in addresses if addresses.count(address) > 1})
    if duplicates:
        raise _fail(f"address(es) {', '.join(duplicates)} appear more than once in \"cluster\"")
    tasks = tuple((kind, i, address) for kind in TRAINING_TASKS for i, address in enumerate(cluster.get(kind, [])))
    return ClusterRole(task["type"], index, len(addresses), hosts[index], "chief" in cluster, tasks)


@dataclass(frozen=True)
class DeviceChoice:
    """--devices: None = every visible GPU; () = CPU only; (0, 2) = those GPUs."""

    gpus: tuple[int, ...] | None = None

    def describe(self) -> str:
        if self.gpus is None:
            return "all"
        return "cpu" if not self.gpus else ",".join(str(index) for index in self.gpus)


def parse_devices(spec: str | None) -> DeviceChoice:
    """"all" (default), "cpu", or comma-separated GPU indices such as "0,1" (GPU:0 and gpu:1 work too)."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return DeviceChoice()
    text = spec.strip().lower()
    if text == "cpu":
        return DeviceChoice(())
    indices = []
    for part in text.split(","):
        part = part.strip().removeprefix("/").removeprefix("device:").removeprefix("gpu:")
        if not part.isdigit():
            raise ConfigError(file_field("--devices", None, f"{spec!r} is not \"all\", \"cpu\" or GPU indices "
                                                            "such as \"0,1\""))
        indices.append(int(part))
    if len(set(indices)) != len(indices):
        raise ConfigError(file_field("--devices", None, f"{spec!r} names a GPU twice"))
    return DeviceChoice(tuple(sorted(indices)))


def logical_cpus(environ=None) -> int:
    """The hidden test setting DEEPDANBOORU_LOGICAL_CPUS (0 when unset)."""
    text = (os.environ if environ is None else environ).get(LOGICAL_CPUS_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(file_field(LOGICAL_CPUS_ENV, None, f"{text!r} is not a positive integer"))
    return int(text)


def prepare_tensorflow(role: ClusterRole, environ=None) -> None:
    """Environment TensorFlow reads when it is imported; call before importing it.

    In a replicated run a replica receives an empty batch whenever a batch has
    fewer records than there are replicas (the end of an epoch, a worker whose
    images ran out first). TensorFlow 2.21's oneDNN convolution returns a
    wrongly shaped result for an empty batch (the input, unchanged), which
    breaks the batch-norm all-reduce that follows, so oneDNN is turned off for
    cluster and logical-CPU runs. GPU convolutions are not affected, and the
    model runs there on GPU hosts; on CPU-only clusters this costs speed
    (docs/distributed.md).
    """
    environ = os.environ if environ is None else environ
    if role.in_cluster or logical_cpus(environ) > 1:
        environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
