"""conv2tflite: conversion, the comparison with Keras, atomic output, and the errors."""

import os

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.errors import UserError

tf = pytest.importorskip("tensorflow")


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def keras_model(tmp_path_factory):
    """A saved resnet_small (32x32, 3 tags) whose batch-norm scales are randomised.

    A fresh model starts every residual branch at zero (gamma = 0) and answers
    almost the same for every image; random scales make outputs depend on the input.
    """
    from deepdanbooru.models.builder import build_model

    model = build_model("resnet_small", (32, 32, 3), 3, seed=1)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.path.endswith("gamma"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
    path = tmp_path_factory.mktemp("convert") / "model.keras"
    model.save(path)
    return path, model


@pytest.mark.slow
def test_tflite_matches_keras_and_is_reported(tmp_path, keras_model, capfd, monkeypatch):
    from deepdanbooru.inference.convert import run_tflite

    path, model = keras_model
    output = tmp_path / "model.tflite"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")  # recorded, so the value main() sets is undone
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")  # as in a shell: main() picks the quiet level (no --debug)
    result = run_cli("conv2tflite", "--model-path", path, "--save-path", output)
    assert result.exit_code == 0, result.output
    assert "XNNPACK" not in capfd.readouterr().err  # the TFLite runtime's INFO line
    umask = os.umask(0)
    os.umask(umask)
    assert output.stat().st_mode & 0o777 == 0o666 & ~umask  # what open() gives, not mkstemp's 0600
    assert f"to {output} (tflite" in result.output
    assert "Largest absolute difference from Keras on 8 sample inputs" in result.output
    # The file on disk, run independently on inputs the command never saw, agrees with Keras.
    images = np.random.default_rng(5).uniform(0, 1, (3, 32, 32, 3)).astype(np.float32)
    expected = model(images, training=False).numpy()
    actual = run_tflite(output.read_bytes(), images)
    assert actual.shape == (3, 3)
    assert np.max(np.abs(actual - expected)) < 1e-4
    # Outputs really differ between inputs, so agreement is not trivial.
    assert np.ptp(expected, axis=0).max() > 1e-3
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_difference_past_tolerance_fails_and_writes_nothing(tmp_path, keras_model):
    path, _ = keras_model
    output = tmp_path / "quantized.tflite"
    result = run_cli("conv2tflite", "--model-path", path, "--save-path", output,
                     "--optimize-default", "--tolerance", "0")
    assert result.exit_code == 1
    assert "differs from Keras by up to" in result.output and "more than the tolerance 0" in result.output
    assert not output.exists() and not list(tmp_path.iterdir())


def test_sample_inputs_cover_the_input_range():
    from deepdanbooru.inference.convert import sample_inputs

    images = sample_inputs(20, 12, count=8, seed=3)
    assert images.shape == (8, 20, 12, 3) and images.dtype == np.float32
    assert images.min() == 0.0 and images.max() == 1.0
    assert np.array_equal(images, sample_inputs(20, 12, count=8, seed=3))
    assert len({image.tobytes() for image in images}) == 8


def test_project_without_export_is_a_clear_error(sample_project, tmp_path):
    result = run_cli("conv2tflite", "--project-path", sample_project, "--save-path", tmp_path / "m.tflite")
    assert result.exit_code == 2
    assert "no exported model (looked for model-resnet_small.keras" in result.output
    assert "train-project" in result.output


@pytest.mark.slow
def test_project_export_is_converted_and_compared_on_real_images(sample_project, sample_dataset, keras_model,
                                                                 tmp_path):
    from deepdanbooru.dataset.records import load_records

    path, _ = keras_model
    (sample_project / "model-resnet_small.keras").write_bytes(path.read_bytes())
    database, _ = sample_dataset
    real = load_records(database, 1, ("jpg", "jpeg", "png")).paths()[:2]
    output = tmp_path / "project.tflite"
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff")
    refused = run_cli("conv2tflite", "--project-path", sample_project, "--save-path", output, "--sample-image", broken)
    assert refused.exit_code == 2 and f"{broken}: unusable sample image" in refused.output
    result = run_cli("conv2tflite", "--project-path", sample_project, "--save-path", output,
                     *[arg for image in real for arg in ("--sample-image", image)])
    assert result.exit_code == 0, result.output
    assert f"Converted {sample_project / 'model-resnet_small.keras'} (the project's final export) to {output}" \
        in result.output
    assert "on 10 sample inputs" in result.output
    assert output.stat().st_size > 100_000


@pytest.mark.slow
def test_sample_images_are_what_evaluate_feeds_the_model(tmp_path, keras_model, exported_project, monkeypatch):
    """A --sample-image reaches the comparison exactly as evaluate gives it to the model: the project's
    padding (white here) and transparency on white, not the built-in border."""
    from pathlib import Path

    from PIL import Image

    from deepdanbooru.inference import convert
    from deepdanbooru.inference.evaluate import evaluate
    from deepdanbooru.inference.predict import Tagger
    from deepdanbooru.pipeline import preprocess_for_inference

    project = exported_project(keras_model[0], 32, "abc", padding="white")
    pixels = np.zeros((12, 30, 4), np.uint8)
    pixels[:, :15] = (200, 10, 10, 255)  # the right half transparent, black stored under it
    picture = tmp_path / "wide.png"
    Image.fromarray(pixels, "RGBA").save(picture)

    compared, fed = [], []

    def compare(model, save_path, output_format, optimize_default, optimize_sparsity, tolerance, images):
        compared.append(images)
        return convert.ConversionReport(Path(save_path), output_format, 0, 0.0, 1e-4, len(images))

    monkeypatch.setattr(convert, "convert_model", compare)
    monkeypatch.setattr(Tagger, "scores", lambda self, images: fed.append(np.asarray(images)) or np.zeros((1, 3)))
    convert.conv2tflite(project_path=project, save_path=tmp_path / "m.tflite", sample_images=[str(picture)],
                        echo=lambda line: None)
    evaluate([picture], project_path=project, echo=lambda line: None, echo_err=lambda line: None)
    assert compared[0].shape == (convert.SAMPLE_COUNT + 1, 32, 32, 3) and len(fed) == 1
    np.testing.assert_array_equal(compared[0][-1:], fed[0])
    assert fed[0][0, 0, 0].tolist() == [1.0, 1.0, 1.0]  # white padding above the wide picture
    before = preprocess_for_inference(picture.read_bytes(), height=32, width=32, max_image_pixels=10**8).numpy()
    assert not np.array_equal(before, fed[0][0])  # the built-in border and dropped alpha of the old preparation


def test_bad_arguments(tmp_path, keras_model):
    path, _ = keras_model
    missing = run_cli("conv2tflite", "--model-path", tmp_path / "nope.keras", "--save-path", tmp_path / "x.tflite")
    assert missing.exit_code == 2 and "nope.keras: model file not found" in missing.output
    nothing = run_cli("conv2tflite", "--save-path", tmp_path / "x.tflite")
    assert nothing.exit_code == 2 and "give --project-path or --model-path" in nothing.output
    no_folder = run_cli("conv2tflite", "--model-path", path, "--save-path", tmp_path / "missing" / "x.tflite")
    assert no_folder.exit_code == 2 and "folder does not exist" in no_folder.output
    onnx_optimized = run_cli("conv2tflite", "--model-path", path, "--save-path", tmp_path / "x.onnx",
                             "--optimize-default")
    assert onnx_optimized.exit_code == 2 and "apply to TFLite only" in onnx_optimized.output


def test_save_path_never_replaces_what_is_not_an_earlier_conversion(tmp_path, keras_model):
    from deepdanbooru.inference.convert import check_save_path

    path, _ = keras_model
    config = tmp_path / "project.json"
    config.write_text('{"model": "resnet_small"}')
    refused = run_cli("conv2tflite", "--model-path", path, "--save-path", config)
    assert refused.exit_code == 2 and refused.output.splitlines() == [
        f"error: {config}: --save-path already exists and is not a tflite model; converting would replace it, so "
        "give another file (or delete this one)"]
    assert config.read_text() == '{"model": "resnet_small"}'
    before = path.read_bytes()
    itself = run_cli("conv2tflite", "--model-path", path, "--save-path", path)
    assert itself.exit_code == 2 and "--save-path is the model being converted" in itself.output
    assert path.read_bytes() == before
    earlier = tmp_path / "old.tflite"
    earlier.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(32))
    check_save_path(earlier, "tflite", path)  # an earlier conversion: replaced
    check_save_path(tmp_path / "old.onnx", "onnx", path)  # nothing there yet
    (tmp_path / "old.onnx").write_bytes(b"\x08\x07")
    check_save_path(tmp_path / "old.onnx", "onnx", path)


def test_format_follows_the_file_name_unless_given():
    from deepdanbooru.inference.convert import choose_format

    assert choose_format("m.onnx") == "onnx"
    assert choose_format("m.tflite") == "tflite"
    assert choose_format("m.bin") == "tflite"
    assert choose_format("m.bin", "onnx") == "onnx" and choose_format("m.onnx", "onnx") == "onnx"
    # A name of the other format would be opened as what the file is not.
    with pytest.raises(UserError, match=r"^--save-path m.tflite: names a TFLite file, but --format onnx writes an "
                                        r"ONNX model; name it .onnx, or leave --format out$"):
        choose_format("m.tflite", "onnx")
    with pytest.raises(UserError, match="--save-path m.ONNX: names an ONNX file, but --format tflite writes a TFLite"):
        choose_format("m.ONNX", "tflite")


@pytest.mark.slow
def test_onnx_matches_keras(tmp_path, keras_model):
    pytest.importorskip("tf2onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    path, model = keras_model
    output = tmp_path / "model.onnx"
    result = run_cli("conv2tflite", "--model-path", path, "--save-path", output)
    assert result.exit_code == 0, result.output
    assert "(onnx," in result.output
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    # Named as the Keras model names them, as tf2onnx's Keras converter named them.
    assert [item.name for item in session.get_inputs()] == ["image"]
    assert [item.name for item in session.get_outputs()] == list(model.output_names)
    images = np.random.default_rng(6).uniform(0, 1, (2, 32, 32, 3)).astype(np.float32)
    actual = session.run(None, {"image": images})[0]
    assert np.max(np.abs(actual - model(images, training=False).numpy())) < 1e-4


def test_onnx_without_the_optional_packages_says_how_to_install(tmp_path, keras_model, monkeypatch):
    from deepdanbooru.inference import onnx_graph

    monkeypatch.setattr(onnx_graph, "onnx_available", lambda: False)
    path, _ = keras_model
    result = run_cli("conv2tflite", "--model-path", path, "--save-path", tmp_path / "m.onnx")
    assert result.exit_code == 2
    assert "needs the optional packages tf2onnx and onnxruntime: pip install 'deepdanbooru[onnx]'" in result.output
    assert not (tmp_path / "m.onnx").exists()
