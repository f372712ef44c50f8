"""Exports: whole or absent, never carrying optimizer state; float32 rebuilds of mixed models."""

import importlib
import os

import keras
import numpy as np
import pytest

from deepdanbooru import compat
from deepdanbooru.models import build_model
from deepdanbooru.models.precision import FLOAT32, MIXED, global_policy, with_policy
from deepdanbooru.training.export import (export_model, remove_partial_checkpoints, remove_partial_exports,
                                          save_atomic)


@pytest.fixture(scope="module")
def small_model():
    return build_model("resnet_small", (32, 32, 3), 5, seed=1)


def test_save_atomic_leaves_only_the_target(tmp_path, small_model):
    target = tmp_path / "model-resnet_small.keras"
    save_atomic(small_model, target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    loaded = keras.models.load_model(target)
    for a, b in zip(loaded.get_weights(), small_model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_compiled_model_refused(tmp_path):
    model = build_model("resnet_small", (32, 32, 3), 3)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    with pytest.raises(ValueError, match="optimizer"):
        save_atomic(model, tmp_path / "x.keras")
    assert not list(tmp_path.iterdir())


def test_failed_save_removes_its_partial_file(tmp_path, small_model, monkeypatch):
    def explode(self, path, *args, **kwargs):
        open(path, "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(keras.Model, "save", explode)
    with pytest.raises(OSError):
        save_atomic(small_model, tmp_path / "model.keras")
    assert not list(tmp_path.iterdir())


def test_partials_of_dead_runs_removed(tmp_path):
    staging = tmp_path / ".model-x.partial-456"
    staging.mkdir()
    (staging / "model-x.keras").write_bytes(b"half")
    (staging / "tmpab12cd").write_bytes(b"weights")  # Keras's weights staged on disk
    (tmp_path / "model-x.e1.keras").write_bytes(b"real")
    (tmp_path / ".notes.partial-1.txt").write_text("not ours")
    removed = remove_partial_exports(tmp_path)
    assert [p.name for p in removed] == [".model-x.partial-456"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.partial-1.txt", "model-x.e1.keras"]


def test_checkpoint_folders_a_killed_save_left_are_removed(tmp_path):
    (tmp_path / "ckpt-4_temp").mkdir()
    (tmp_path / "ckpt-4_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"half")
    (tmp_path / "ckpt-3.index").write_bytes(b"real")
    assert [p.name for p in remove_partial_checkpoints(tmp_path)] == ["ckpt-4_temp"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-3.index"]


def test_weights_staged_on_disk_during_the_save_only(tmp_path, small_model, monkeypatch):
    saving_lib = importlib.import_module(compat.SAVING_LIB)

    judge = saving_lib.is_memory_sufficient
    seen = []
    real_save = keras.Model.save

    def spy(self, path, *args, **kwargs):
        seen.append((saving_lib.is_memory_sufficient(self), sorted(p.name for p in tmp_path.iterdir())))
        return real_save(self, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", spy)
    save_atomic(small_model, tmp_path / "model-x.keras")
    assert seen == [(False, [f".model-x.partial-{os.getpid()}"])]
    assert saving_lib.is_memory_sufficient is judge
    assert [p.name for p in tmp_path.iterdir()] == ["model-x.keras"]


@pytest.mark.slow
def test_mixed_model_and_float32_copy(tmp_path):
    with global_policy(MIXED):
        mixed = build_model("resnet_small", (32, 32, 3), 4, seed=2)
    assert keras.mixed_precision.global_policy().name == FLOAT32  # not leaked
    assert mixed.get_layer("stem_conv").compute_dtype == "float16"
    assert mixed.output.dtype == "float32"
    written = export_model(mixed, tmp_path / "m.keras", float32_copy=tmp_path / "m.float32.keras")
    assert [p.name for p in written] == ["m.keras", "m.float32.keras"]
    copy = keras.models.load_model(tmp_path / "m.float32.keras")
    assert {layer.dtype_policy.name for layer in copy.layers if not isinstance(layer, keras.layers.InputLayer)} \
        == {FLOAT32}
    images = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(copy.predict(images, verbose=0), mixed.predict(images, verbose=0), atol=2e-2)


def test_with_policy_keeps_output_float32(small_model):
    mixed = with_policy(small_model, MIXED)
    assert mixed.get_layer("stem_conv").compute_dtype == "float16"
    assert mixed.get_layer("output").compute_dtype == "float32"
    assert getattr(mixed, "optimizer", None) is None
    for a, b in zip(mixed.get_weights(), small_model.get_weights()):
        np.testing.assert_array_equal(a, b)
