"""Is there an NVIDIA GPU in this machine, whatever TensorFlow can do with it? Standard library only.

create-project asks (a GPU machine's new project trains in mixed precision)
without starting TensorFlow, and train-project asks when TensorFlow found no
GPU: the usual reason is a TensorFlow installed without its CUDA libraries,
which otherwise trains on the CPU without a word. The driver is what shows a
GPU: its /proc entries, its device files, or nvidia-smi.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

GPU_EXTRA = 'pip install -e ".[gpu]"'
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
DEVICES = Path("/dev")


def find_gpus(proc: Path = PROC_GPUS, devices: Path = DEVICES, which=shutil.which, run=subprocess.run) -> list[str]:
    """The NVIDIA GPUs the driver shows, by model name where it gives one ("GPU" otherwise); [] for none."""
    if proc.is_dir():
        names = []
        for entry in sorted(proc.iterdir()):
            try:
                text = (entry / "information").read_text(errors="replace")
            except OSError:
                text = ""
            found = re.search(r"^Model:\s*(.+?)\s*$", text, re.MULTILINE)
            names.append(found.group(1) if found else "GPU")
        if names:
            return names
    try:
        nodes = [node for node in devices.iterdir() if re.fullmatch(r"nvidia\d+", node.name)]
    except OSError:
        nodes = []
    if nodes:
        return ["GPU"] * len(nodes)
    tool = which("nvidia-smi")
    if tool is None:
        return []
    try:
        listed = run([tool, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    if listed.returncode:
        return []
    return re.findall(r"^GPU \d+: (.+?)(?: \(UUID.*)?$", listed.stdout or "", re.MULTILINE)


def describe(names: list[str]) -> str:
    """'a GPU (NVIDIA H200)', '2 GPUs (NVIDIA H200)', '2 GPUs'."""
    counted = "a GPU" if len(names) == 1 else f"{len(names)} GPUs"
    models = sorted(set(names) - {"GPU"})
    return f"{counted} ({', '.join(models)})" if models else counted


def unused_gpu_note(names: list[str]) -> str | None:
    """The one line for a machine whose GPU TensorFlow cannot use (None when there is no GPU)."""
    if not names:
        return None
    return (f"this machine has {describe(names)} but TensorFlow cannot use it, so this run trains on the CPU: "
            f"install TensorFlow's CUDA libraries ({GPU_EXTRA}, or pip install \"tensorflow[and-cuda]\") "
            f"or pass --devices cpu to train on the CPU on purpose")
