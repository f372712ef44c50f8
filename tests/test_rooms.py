"""The standard-library rooms (project/, dataset/, preflight/) start without TensorFlow and without training/.

`deepdanbooru --help` and the preflight scripts must run where TensorFlow cannot even be imported, so no
module of these rooms may import training/ (which is TensorFlow's side), not even lazily inside a function.
"""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import deepdanbooru

ROOMS = ("project", "dataset", "preflight")
PACKAGE = Path(deepdanbooru.__file__).parent
FOLDER = Path(__file__).resolve().parent / "fixtures" / "timm" / "vit_wd"


def room_modules():
    return sorted(f"deepdanbooru.{room}." + path.stem if path.stem != "__init__" else f"deepdanbooru.{room}"
                  for room in ROOMS for path in (PACKAGE / room).glob("*.py"))


def test_every_room_module_is_found():
    modules = room_modules()
    assert "deepdanbooru.preflight.checks" in modules and "deepdanbooru.project.resume" in modules
    assert len(modules) > 15


# An import of TensorFlow, Keras or training/ in any spelling, also indented (a lazy import inside a function).
HEAVY_IMPORT = re.compile(r"^\s*(?:import\s+(?:tensorflow|keras|deepdanbooru\.training)\b"
                          r"|from\s+(?:tensorflow|keras|deepdanbooru\.training)\b"
                          r"|from\s+deepdanbooru\s+import\s+(?:[\w\s,()]*\b)?training\b)", re.MULTILINE)


@pytest.mark.parametrize("line", ["import tensorflow as tf", "    from tensorflow import keras", "import keras",
                                  "from keras import layers", "    from deepdanbooru.training.train import x",
                                  "from deepdanbooru import training", "from deepdanbooru import errors, training"])
def test_the_source_check_sees_every_spelling_of_a_heavy_import(line):
    assert HEAVY_IMPORT.search(f"x = 1\n{line}\n")


def test_no_room_module_names_training_in_its_source():
    # A lazy import inside a function is not seen by importing the module: read the source too.
    offenders = [str(path.relative_to(PACKAGE)) for room in ROOMS for path in (PACKAGE / room).glob("*.py")
                 if HEAVY_IMPORT.search(path.read_text(encoding="utf-8"))
                 or "deepdanbooru.training" in path.read_text(encoding="utf-8")]  # importlib's spelling too
    assert offenders == []


def test_preflight_of_a_stopped_fine_tune_imports_neither_training_nor_tensorflow(sample_project, tmp_path):
    # A run from --source-model stopped before its first checkpoint leaves checkpoints/start.json; preflight's
    # checkpoint check reads it (that read once went through training/).
    source = tmp_path / "source.keras"
    source.write_bytes(b"not read by preflight")
    checkpoints = sample_project / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "start.json").write_text(json.dumps({"source_model": str(source), "source_tags": None}))
    code = textwrap.dedent(f"""
        import importlib, json, sys
        for name in {room_modules()!r}:
            importlib.import_module(name)
        from deepdanbooru.preflight.main import training_preflight
        results = training_preflight({str(sample_project)!r}, max_image_checks=2)
        checkpoint = [r.detail for r in results if r.name == "checkpoint"]
        # And sizing a timm folder given as --source-model.
        given = training_preflight({str(sample_project)!r}, max_image_checks=2, source_model={str(FOLDER)!r})
        model = [r.detail for r in given if r.name == "model"]
        heavy = sorted(m for m in sys.modules if m.startswith("deepdanbooru.training")
                       or m.split(".")[0] in ("tensorflow", "keras", "numpy"))
        print(json.dumps({{"checkpoint": checkpoint, "model": model, "heavy": heavy}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["heavy"] == []
    assert len(outcome["checkpoint"]) == 1
    assert f"starts FRESH from --source-model {source}" in outcome["checkpoint"][0]
    assert "start.json there" in outcome["checkpoint"][0]
    assert outcome["model"][0].startswith("vit_base_patch16_224-depth2-dim32-heads4-patch8-img32 (the network of "
                                          f"--source-model {FOLDER}")
