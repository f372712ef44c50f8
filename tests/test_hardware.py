"""The GPU probe without TensorFlow, create-project's mixed precision on a GPU machine, and the unused-GPU line."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from deepdanbooru import hardware
from deepdanbooru.hardware import find_gpus
from deepdanbooru.project.create import create_project


def _nowhere(name):
    return None


def test_the_driver_s_proc_entries_name_each_gpu(tmp_path):
    proc = tmp_path / "gpus"
    for index, model in enumerate(["NVIDIA H200", "NVIDIA H200"]):
        (proc / f"0000:0{index}:00.0").mkdir(parents=True)
        (proc / f"0000:0{index}:00.0" / "information").write_text(f"Model: \t\t {model}\nIRQ:   42\n")
    names = find_gpus(proc, tmp_path / "dev", which=_nowhere)
    assert names == ["NVIDIA H200", "NVIDIA H200"]
    assert hardware.describe(names) == "2 GPUs (NVIDIA H200)"


def test_device_files_then_nvidia_smi_then_nothing(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").write_text("")
    (dev / "nvidia0").write_text("")
    assert find_gpus(tmp_path / "none", dev, which=_nowhere) == ["GPU"]
    (dev / "nvidia0").unlink()

    def nvidia_smi(command, **kwargs):
        assert command == ["/usr/bin/nvidia-smi", "-L"]
        return subprocess.CompletedProcess(command, 0, "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1234)\n", "")

    assert find_gpus(tmp_path / "none", dev, which=lambda name: "/usr/bin/" + name,
                     run=nvidia_smi) == ["NVIDIA A100-SXM4-80GB"]
    assert find_gpus(tmp_path / "none", dev, which=_nowhere) == []
    failing = lambda command, **kwargs: subprocess.CompletedProcess(command, 9, "", "no driver")  # noqa: E731
    assert find_gpus(tmp_path / "none", dev, which=lambda name: "/x/" + name, run=failing) == []


def test_the_probe_does_not_import_tensorflow():
    code = ("import sys; from deepdanbooru import hardware; hardware.find_gpus(); "
            "assert 'tensorflow' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_create_project_writes_mixed_precision_true_on_a_gpu_machine_only(tmp_path, monkeypatch):
    lines = []
    create_project(tmp_path / "cpu", echo=lines.append)
    assert json.loads((tmp_path / "cpu" / "project.json").read_text())["mixed_precision"] is False
    assert not any("GPU" in line for line in lines)
    monkeypatch.setattr(hardware, "find_gpus", lambda: ["NVIDIA H200"])
    for recipe in ("deepdanbooru", "modern"):
        lines = []
        create_project(tmp_path / recipe, echo=lines.append, recipe=recipe)
        assert json.loads((tmp_path / recipe / "project.json").read_text())["mixed_precision"] is True
        assert "  this machine has a GPU (NVIDIA H200): mixed_precision is true (docs/choosing.md)" in lines


def test_a_gpu_tensorflow_cannot_use_gets_one_line_saying_what_to_install(monkeypatch):
    pytest.importorskip("tensorflow")
    from deepdanbooru.runstate.cluster import ClusterRole, DeviceChoice
    from deepdanbooru.training import strategy

    monkeypatch.setattr(hardware, "find_gpus", lambda: ["NVIDIA H200"])
    role = ClusterRole()
    with pytest.warns(UserWarning) as caught:
        strategy._create_strategy(DeviceChoice(), role, 1)
    (message,) = [str(w.message) for w in caught]
    assert message == ("this machine has a GPU (NVIDIA H200) but TensorFlow cannot use it, so this run trains on "
                       "the CPU: install TensorFlow's CUDA libraries (pip install -e \".[gpu]\", or pip install "
                       "\"tensorflow[and-cuda]\") or pass --devices cpu to train on the CPU on purpose")
    # --devices cpu is a choice, not an accident.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy._create_strategy(DeviceChoice(()), role, 1)
    assert not [w for w in caught if "TensorFlow cannot use" in str(w.message)]
