"""grad-cam: the maps are what they claim to be, and the files land under safe names."""

import os

import numpy as np
import pytest

from deepdanbooru.inference.names import UniqueNames, safe_file_name

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def test_safe_file_names():
    assert safe_file_name("long_hair") == "long_hair"
    assert safe_file_name("a/b\\c") == "a_b_c"
    assert safe_file_name("..") == "_"
    assert safe_file_name("../../etc/passwd") == "__.._etc_passwd"
    assert safe_file_name(".hidden") == "_hidden"
    assert safe_file_name('what?:<>|*"') == "what_______"
    assert safe_file_name("tab\there") == "tab_here"
    assert safe_file_name("con") == "_con" and safe_file_name("LPT1.txt") == "_LPT1.txt"
    assert safe_file_name("trailing. ") == "trailing"
    assert safe_file_name("") == "_"
    assert safe_file_name(":d") == "_d"
    assert len(safe_file_name("é" * 300).encode()) <= 200
    # A file name that is not UTF-8, as Python reads it from the disk (lone surrogates).
    assert safe_file_name(os.fsdecode(b"bad\xff\xfe.png")) == "bad__.png"


def test_unique_names_never_collide():
    names = UniqueNames()
    assert [names(n) for n in ("a/b", "a_b", "A_B", "c")] == ["a_b", "a_b-2", "A_B-3", "c"]


def _randomised(model, seed=0):
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if weight.path.endswith("gamma"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
    return model


@pytest.fixture(scope="module")
def small_model():
    from deepdanbooru.models.builder import build_model

    return _randomised(build_model("resnet_small", (64, 64, 3), 4, seed=2))


def test_feature_tensor_is_the_last_stage_before_a_conv_head(small_model):
    from deepdanbooru.inference.gradcam import feature_tensor

    tensor = feature_tensor(small_model)
    assert tuple(tensor.shape) == (None, 2, 2, 512)
    assert tensor is small_model.get_layer("head_conv").input


def test_feature_tensor_skips_a_pooling_dense_head():
    from deepdanbooru.inference.gradcam import feature_tensor

    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, name="trunk")(inputs)
    x = keras.layers.Activation("relu", name="trunk_relu")(x)
    x = keras.layers.AveragePooling2D(2)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(3)(x)
    outputs = keras.layers.Activation("sigmoid")(x)
    model = keras.Model(inputs, outputs)
    assert feature_tensor(model) is model.get_layer("trunk_relu").output


def test_gradcam_equals_the_class_activation_map_for_a_conv_head(small_model):
    """With a 1x1 conv head and global average pooling, the logit is the spatial mean
    of the head's map, so Grad-CAM's channel weights are the head's kernel column:
    the normalised map must equal relu(head conv output) upsampled."""
    from deepdanbooru.inference.gradcam import Explainer

    image = np.random.default_rng(1).uniform(0, 1, (64, 64, 3)).astype(np.float32)
    explainer = Explainer(small_model)
    maps = explainer.explain(image, [0, 3])
    head = keras.Model(small_model.input, small_model.get_layer("head_conv").output)
    class_maps = head(image[None], training=False).numpy()[0]
    scores = small_model(image[None], training=False).numpy()[0]
    for tag_maps, tag in zip(maps, [0, 3]):
        assert tag_maps.tag_index == tag
        assert tag_maps.score == pytest.approx(scores[tag], rel=1e-5)
        expected = np.maximum(class_maps[..., tag], 0)[None, ..., None]
        expected = tf.image.resize(expected, (64, 64), method="bilinear").numpy()[0, ..., 0]
        if expected.max() > 0:
            expected /= expected.max()
        assert tag_maps.gradcam.shape == (64, 64)
        np.testing.assert_allclose(tag_maps.gradcam, expected, atol=1e-4)
        assert tag_maps.saliency.shape == (64, 64)
        assert tag_maps.saliency.max() == pytest.approx(1.0) and tag_maps.saliency.min() >= 0


def test_saliency_is_the_input_gradient():
    """A model whose logit is the mean of the red channel over the left half: the
    gradient is constant there and zero elsewhere."""
    from deepdanbooru.inference.gradcam import Explainer

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer=keras.initializers.Constant([[[[1.0], [0.0], [0.0]]]]),
                            name="red")(inputs)
    x = keras.layers.Cropping2D(((0, 0), (0, 4)), name="left_half")(x)
    x = keras.layers.Conv2D(1, 1, use_bias=False, kernel_initializer="ones", name="head_conv")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Activation("sigmoid")(x)
    model = keras.Model(inputs, outputs)
    image = np.random.default_rng(2).uniform(0, 1, (8, 8, 3)).astype(np.float32)
    (maps,) = Explainer(model).explain(image, [0])
    expected = np.zeros((8, 8), dtype=np.float32)
    expected[:, :4] = 1.0
    np.testing.assert_allclose(maps.saliency, expected, atol=1e-6)
    assert maps.score == pytest.approx(1 / (1 + np.exp(-image[:, :4, 0].mean())), rel=1e-5)


def test_heat_colours_and_overlay_ranges():
    from deepdanbooru.inference.gradcam import gradcam_overlay, heat_colours, masked_image

    colours = heat_colours(np.array([[0.0, 1.0]]))
    assert colours.shape == (1, 2, 3)
    assert colours[0, 0, 2] > colours[0, 0, 0] and colours[0, 1, 0] > colours[0, 1, 2]  # cold blue, hot red
    image = np.full((4, 4, 3), 0.5, dtype=np.float32)
    overlay = gradcam_overlay(image, np.linspace(0, 1, 16).reshape(4, 4))
    assert overlay.min() >= 0 and overlay.max() <= 1
    assert np.array_equal(masked_image(image, np.zeros((4, 4))), np.zeros((4, 4, 3)))


def run_cli(*args):
    from click.testing import CliRunner

    from deepdanbooru.cli import main

    return CliRunner().invoke(main, [str(arg) for arg in args])


WEIRD_TAGS = ["a/b", "a_b", ".hidden", "con"]


@pytest.fixture
def gradcam_project(tmp_path, small_model):
    import json

    project = tmp_path / "project"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({"image_width": 64, "image_height": 64, "model": "resnet_small"}))
    (project / "tags.txt").write_text("\n".join(WEIRD_TAGS) + "\n")
    small_model.save(project / "model-resnet_small.keras")
    return project


def test_grad_cam_writes_pngs_per_tag_with_safe_names(gradcam_project, tmp_path, small_model):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (80, 50, 3), dtype=np.uint8)).save(images / "cat.png")
    Image.fromarray(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)).save(images / "dog.jpg")
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    output = tmp_path / "out"
    result = run_cli("grad-cam", gradcam_project, images, output, "--threshold", "0")
    assert result.exit_code == 1  # broken.png was skipped
    assert f"skipped {images / 'broken.png'}: " in result.stderr
    assert f"{images / 'cat.png'}: 4 tags -> {output / 'cat'}" in result.stdout
    expected = {f"{stem}.{kind}.png" for stem in ("a_b", "a_b-2", "_hidden", "_con")
                for kind in ("gradcam", "saliency", "masked")}
    for name in ("cat", "dog"):
        folder = output / name
        assert {p.name for p in folder.iterdir()} == expected
        with Image.open(folder / "a_b.gradcam.png") as picture:
            assert picture.size == (64, 64) and picture.mode == "RGB"
        with Image.open(folder / "_con.saliency.png") as picture:
            assert picture.size == (64, 64) and picture.mode == "L"
            assert np.asarray(picture).max() == 255  # normalised: the strongest gradient is white
    assert not (output / "broken").exists()
    assert sorted(p.name for p in output.iterdir()) == ["cat", "dog"]


@pytest.mark.slow
def test_grad_cam_threshold_and_default_output(gradcam_project, tmp_path, monkeypatch):
    from PIL import Image

    image = tmp_path / "one.png"
    Image.new("RGB", (64, 64), (200, 10, 10)).save(image)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    nothing = run_cli("grad-cam", gradcam_project, image, "--threshold", "1")
    assert nothing.exit_code == 0, nothing.output
    assert "no tag scored 1.0 or more; nothing written" in nothing.stdout
    assert list(work.iterdir()) == []
    result = run_cli("grad-cam", gradcam_project, image, "--threshold", "0")
    assert result.exit_code == 0, result.output
    assert len(list((work / "one").glob("*.png"))) == 12


def test_grad_cam_needs_an_exported_model(tmp_path):
    import json

    project = tmp_path / "empty"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({"model": "resnet_small"}))
    (project / "tags.txt").write_text("a\n")
    image = tmp_path / "x.png"
    image.write_bytes(b"")
    result = run_cli("grad-cam", project, image)
    assert result.exit_code == 2 and "no exported model" in result.stderr
