"""Shared by the tests/test_train_*.py files: tiny projects and ways to compare their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# 24 posts of 32x32, batch 4, slices of 2 minibatches: 3 checkpoints per epoch, the last one a partial slice.
TINY = {
    "image_width": 32,
    "image_height": 32,
    "minimum_tag_count": 1,
    "model": "resnet_small",
    "minibatch_size": 4,
    "epoch_count": 2,
    "checkpoint_frequency_mb": 2,
    "console_logging_frequency_mb": 1,
    "export_model_per_epoch": 1,
    "validation_fraction": 0.0,
}


def make_project(directory: Path, database, tags, **overrides) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {**TINY, "database_path": str(database), **overrides}
    (directory / "project.json").write_text(json.dumps(config, indent=2))
    (directory / "tags.txt").write_text("\n".join(tags) + "\n")
    return directory


def set_config(project: Path, **changes) -> None:
    path = project / "project.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))


def read_state(project: Path) -> dict:
    return json.loads((project / "checkpoints" / "state.json").read_text())


def checkpoint_prefixes(project: Path) -> list[str]:
    return sorted(p.name[: -len(".index")] for p in (project / "checkpoints").glob("ckpt-*.index"))


def weights(path: Path):
    import keras

    return keras.models.load_model(path).get_weights()


def assert_same_weights(a: Path, b: Path) -> None:
    left, right = weights(a), weights(b)
    assert len(left) == len(right)
    for x, y in zip(left, right):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert (x == y).all(), f"max difference {abs(x - y).max()}"


def killed_copy(reference: Path, target: Path, checkpoint: str, later_exports) -> Path:
    """A copy of a finished run as if killed right after writing `checkpoint` (e.g. "ckpt-4"): that checkpoint
    is the latest, and the exports written after it are gone."""
    import shutil

    shutil.copytree(reference, target)
    for name in later_exports:
        (target / name).unlink()
    (target / "checkpoints" / "checkpoint").write_text(
        f'model_checkpoint_path: "{checkpoint}"\nall_model_checkpoint_paths: "{checkpoint}"\n')
    return target


def cli_env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))


def train_command(project: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deepdanbooru", "train-project", str(project), *extra]


def run_cli(project: Path, *extra: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(train_command(project, *extra), env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def head_model(seed: int, conv_name: str = "conv", batch_norm: bool = False):
    """A 4x4 picture -> Conv2D(2) [-> BatchNormalization] -> pooling -> a 3-tag sigmoid head named "head": the
    smallest network with a trunk and a head, for the fine-tune keeping tests."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Conv2D(2, 3, name=conv_name)(inputs)
    if batch_norm:
        x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid", name="head")(x))
