"""Mixed precision: float16 compute where it pays, float32 copies of every export, --source-model too."""

import keras
import numpy as np
import pytest
from train_helpers import make_project

from deepdanbooru.models.precision import FLOAT32, FORCE_ENV, MIXED, choose_policy
from deepdanbooru.training.train import train_project


def _policies(path):
    model = keras.models.load_model(path)
    return {layer.name: layer.dtype_policy.name for layer in model.layers
            if not isinstance(layer, keras.layers.InputLayer)}


def test_policy_choice_without_a_gpu(monkeypatch):
    monkeypatch.delenv(FORCE_ENV, raising=False)
    notices = []
    assert choose_policy(False, echo=notices.append) == FLOAT32 and notices == []
    assert choose_policy(True, echo=notices.append) == FLOAT32
    assert len(notices) == 1 and "no GPU is visible; training in float32" in notices[0]
    assert "--force-mixed-precision" in notices[0] and FORCE_ENV in notices[0]
    assert choose_policy(True, force=True, echo=notices.append) == MIXED
    monkeypatch.setenv(FORCE_ENV, "1")
    assert choose_policy(True, echo=notices.append) == MIXED
    assert len(notices) == 1


@pytest.mark.slow
def test_forced_mixed_precision_writes_float32_copies(tmp_path, sample_dataset):
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, mixed_precision=True)
    lines = []
    train_project(project, force_mixed_precision=True, echo=lines.append)
    assert any("mixed_float16" in line for line in lines if line.startswith("Model:"))
    assert sorted(p.name for p in project.glob("*.keras")) == [
        "model-resnet_small.e1.float32.keras", "model-resnet_small.e1.keras",
        "model-resnet_small.float32.keras", "model-resnet_small.keras"]
    mixed = _policies(project / "model-resnet_small.keras")
    assert mixed["stem_conv"] == MIXED and mixed["output"] == FLOAT32
    assert set(_policies(project / "model-resnet_small.float32.keras").values()) == {FLOAT32}
    images = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    a = keras.models.load_model(project / "model-resnet_small.keras").predict(images, verbose=0)
    b = keras.models.load_model(project / "model-resnet_small.float32.keras").predict(images, verbose=0)
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_allclose(a, b, atol=2e-2)
    assert np.isfinite(a).all()


@pytest.mark.slow
def test_mixed_precision_with_source_model(tmp_path, sample_dataset):
    from deepdanbooru.models import build_model

    source = tmp_path / "source.keras"
    start = build_model("resnet_small", (32, 32, 3), len(sample_dataset[1]), seed=5)
    start.save(source)
    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, export_model_per_epoch=10,
                           mixed_precision=True, checkpoint_frequency_mb=3)
    lines = []
    train_project(project, source_model=source, force_mixed_precision=True, echo=lines.append)
    assert any(line.startswith("Model: resnet_small (from ") and "mixed_float16" in line for line in lines)
    assert sorted(p.name for p in project.glob("*.keras")) == [
        "model-resnet_small.float32.keras", "model-resnet_small.keras"]
    assert _policies(project / "model-resnet_small.keras")["stem_conv"] == MIXED
    trained = keras.models.load_model(project / "model-resnet_small.float32.keras").get_layer("stem_conv")
    # Six Adam steps at 0.001 move a weight by at most ~0.006: the result sits next to the source's
    # weights (seed 5), far from the project's own initial weights (seed 0), and it did move.
    kernel = trained.get_weights()[0]
    source_kernel = start.get_layer("stem_conv").get_weights()[0]
    own_kernel = build_model("resnet_small", (32, 32, 3), len(sample_dataset[1]), seed=0) \
        .get_layer("stem_conv").get_weights()[0]
    assert 0 < np.abs(kernel - source_kernel).max() < 0.02
    assert np.abs(kernel - own_kernel).max() > 0.1


@pytest.mark.parametrize("value", ["1", "true"])
def test_environment_override_is_documented_in_the_notice(value, monkeypatch):
    monkeypatch.setenv(FORCE_ENV, value)
    assert choose_policy(True, echo=pytest.fail) == MIXED
