"""Optional checks of the runtime: installed package versions, imports, TensorFlow.

Imports and TensorFlow run in child processes, so preflight itself never
loads TensorFlow, and a package that crashes on import (wrong CPU
instructions, a broken CUDA install) is reported instead of killing preflight.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from deepdanbooru.errors import tf_message_text
from deepdanbooru.preflight.results import FAIL, PASS, WARN, CheckResult

# Runtime packages: (import name, distribution names that provide it, requirement name in pyproject).
PACKAGES = (
    ("tensorflow", ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"), "tensorflow"),
    ("keras", ("keras",), "keras"),
    ("click", ("click",), "click"),
    ("numpy", ("numpy",), "numpy"),
    ("PIL", ("pillow",), "pillow"),
)
PROBE_TIMEOUT_S = 600

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> dict[str, str]:
    """Runtime requirement specifiers by package name: from the checkout's pyproject.toml, else the install."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    lines: list[str] = []
    if pyproject.is_file():
        try:
            lines = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
        except (OSError, ValueError, KeyError):
            lines = []
    if not lines:
        try:
            lines = [r for r in metadata.requires("deepdanbooru") or () if "extra ==" not in r]
        except metadata.PackageNotFoundError:
            lines = []
    result = {}
    for line in lines:
        match = _REQUIREMENT.match(line)
        if match:
            result[_normalize(match.group(1))] = match.group(2).strip()
    return result


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def satisfies(version: str, specifier: str) -> bool:
    """Release-number comparison for the specifiers we pin with (>=, <, <=, >, ==, !=, ~=)."""
    have = _release(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.match(r"(~=|==|!=|>=|<=|>|<)\s*(.+)", clause)
        if not match:
            continue
        operator, wanted = match.group(1), _release(match.group(2))
        width = max(len(have), len(wanted))
        a, b = have + (0,) * (width - len(have)), wanted + (0,) * (width - len(wanted))
        ok = {
            ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b,
            "~=": a >= b and have[: len(wanted) - 1] == wanted[:-1],
        }[operator]
        if not ok:
            return False
    return True


def check_packages() -> list[CheckResult]:
    """Installed distributions and their versions against our pins, without importing anything."""
    wanted = declared_requirements()
    results = []
    for module, distributions, requirement in PACKAGES:
        name = f"package {distributions[0]}"
        found = None
        for distribution in distributions:
            try:
                found = (distribution, metadata.version(distribution))
                break
            except metadata.PackageNotFoundError:
                continue
        specifier = wanted.get(requirement, "")
        if found is None:
            results.append(CheckResult(name, FAIL, f"not installed; deepdanbooru needs {requirement}{specifier} "
                                                   "(pip install -e . from the checkout installs it)"))
            continue
        label = f"{found[0]} {found[1]}"
        if specifier and not satisfies(found[1], specifier):
            results.append(CheckResult(name, FAIL, f"{label} is installed; deepdanbooru needs {specifier}"))
        else:
            results.append(CheckResult(name, PASS, label + (f" (needs {specifier})" if specifier else "")))
    return results


_IMPORT_CODE = """
import importlib, json, sys
name = sys.argv[1]
module = importlib.import_module(name)
info = {"version": str(getattr(module, "__version__", "unknown"))}
if name == "keras":
    info["backend"] = module.backend.backend()
print(json.dumps(info))
"""


def _child(code: str, args=(), stdin: str | None = None, timeout=PROBE_TIMEOUT_S):
    """Run code in a fresh interpreter; (parsed last JSON line or None, a one-line failure reason)."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONDONTWRITEBYTECODE="1")
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return json.loads(lines[-1]), ""
        except ValueError:
            pass
    errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
    if done.returncode < 0:
        return None, f"the process was killed by signal {-done.returncode}"
    return None, errors[-1] if errors else f"exit code {done.returncode}"


def probe_imports() -> list[CheckResult]:
    results = []
    for module, _, _ in PACKAGES:
        info, problem = _child(_IMPORT_CODE, [module])
        name = f"import {module}"
        if info is None:
            results.append(CheckResult(name, FAIL, f"cannot be imported: {problem}"))
        else:
            extra = f", backend {info['backend']}" if "backend" in info else ""
            results.append(CheckResult(name, PASS, f"version {info['version']}{extra}"))
    return results


_TENSORFLOW_CODE = """
import json, sys
request = json.load(sys.stdin)
tf = __import__("tensorflow")  # in the child process only: this room never imports it
report = {"version": tf.__version__,
          "cpus": [d.name for d in tf.config.list_physical_devices("CPU")],
          "gpus": [d.name for d in tf.config.list_physical_devices("GPU")]}
with tf.device("/CPU:0"):
    report["cpu_sum"] = float(tf.reduce_sum(tf.range(10, dtype=tf.float32)))
decoded = []
for path, kind, animated in request["images"]:
    try:
        data = tf.io.read_file(path)
        # WebP as training reads it (pipeline/decode.py): decode_webp returns [frames, height,
        # width, channels] even for a still picture, and training takes frame 0. An animated WebP
        # needs channels=4 with the alpha flag (0x10, byte 20) set: channels=0 kills the process
        # and channels=4 without the flag is refused (TF 2.21).
        if kind == "webp":
            if animated:
                raw = data.numpy()
                data = tf.constant(raw[:20] + bytes([raw[20] | 0x10]) + raw[21:])
            image = tf.io.decode_webp(data, channels=4 if animated else 0)[0]
        else:
            image = tf.io.decode_image(data, channels=3, expand_animations=False)
        decoded.append([int(image.shape[0]), int(image.shape[1]), ""])
    except Exception as error:
        decoded.append([0, 0, (str(error).strip().splitlines() or [type(error).__name__])[0]])
report["decoded"] = decoded
print(json.dumps(report))
"""


def probe_tensorflow(images) -> list[CheckResult]:
    """TensorFlow sees and uses a CPU, and decodes `images`: (id, path, ImageInfo) already read from headers."""
    request = json.dumps({"images": [[path, info.format, info.animated] for _, path, info in images]})
    report, problem = _child(_TENSORFLOW_CODE, stdin=request)
    if report is None:
        return [CheckResult("tensorflow", FAIL, f"TensorFlow cannot run: {problem}")]
    if not report["cpus"] or report["cpu_sum"] != 45.0:
        results = [CheckResult("tensorflow", FAIL, f"TensorFlow {report['version']} did not compute on a CPU")]
    else:
        gpus = report["gpus"]
        # Listing a GPU proves nothing about its driver, memory or kernels: say only what was seen.
        gpu_note = (f"{len(gpus)} GPU(s) listed, not tested by preflight" if gpus else "no GPU listed")
        results = [CheckResult("tensorflow", PASS,
                               f"TensorFlow {report['version']} computed on {report['cpus'][0]}; {gpu_note}")]
    bad = []
    for (row_id, path, info), (height, width, error) in zip(images, report["decoded"]):
        if error:
            bad.append(f"id {row_id} {path}: {tf_message_text(error)}")
        elif (height, width) != (info.height, info.width):
            bad.append(f"id {row_id} {path}: decoded {width}x{height}, header says {info.width}x{info.height}")
    if not images:
        results.append(CheckResult("tensorflow decode", WARN, "no readable sampled image to decode"))
    elif bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        results.append(CheckResult("tensorflow decode", FAIL,
                                   f"{len(bad)} of {len(images)} sampled images do not decode: {shown}"))
    else:
        results.append(CheckResult("tensorflow decode", PASS,
                                   f"all {len(images)} sampled images decode with tf.io at their header size"))
    return results
