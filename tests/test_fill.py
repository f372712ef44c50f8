"""pipeline.fill: white padding and alpha on white, as the WD tagger tools feed pictures; the defaults unchanged."""

import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

tf = pytest.importorskip("tensorflow")

from deepdanbooru.pipeline import (  # noqa: E402
    Augmentation, Fill, TrainingInput, preprocess_for_inference, training_dataset,
)

LIMIT = 10_000_000


def encoded(pixels, mode, fmt="PNG", **options):
    from PIL import Image

    buffer = io.BytesIO()
    picture = Image.fromarray(pixels, mode)
    if fmt == "PNG" and mode == "P":
        picture.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    picture.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def transparent_rgba(height=8, width=16):
    """Left half opaque red, right half fully transparent with black stored under it."""
    pixels = np.zeros((height, width, 4), np.uint8)
    pixels[:, : width // 2] = (200, 10, 10, 255)
    return pixels


def run(data, fill=Fill(), size=(16, 16)):
    return preprocess_for_inference(tf.constant(data), height=size[0], width=size[1], max_image_pixels=LIMIT,
                                    fill=fill).numpy()


def test_white_padding_surrounds_a_wide_picture_and_keeps_its_pixels():
    pixels = np.zeros((8, 16, 3), np.uint8)
    pixels[...] = (40, 80, 120)
    pixels[0] = (10, 20, 30)  # a distinct top row: border replication repeats it upward
    data = encoded(pixels, "RGB")
    border, white = run(data), run(data, Fill(padding="white"))
    # The picture (8 rows, centred: rows 4-11) is the same both ways; outside it, border repeats, white is white.
    np.testing.assert_array_equal(border[4:12], white[4:12])
    np.testing.assert_array_equal(white[:4], 1.0)
    np.testing.assert_array_equal(white[12:], 1.0)
    np.testing.assert_allclose(border[:4], np.broadcast_to(np.array([10, 20, 30]) / 255.0, (4, 16, 3)), rtol=1e-6)
    # The default is DeepDanbooru's border replication, with or without an explicit Fill.
    np.testing.assert_array_equal(run(data, Fill(padding="border", alpha="drop")), border)


@pytest.mark.parametrize("mode, pixels, fmt", [
    ("RGBA", transparent_rgba(), "PNG"),
    ("LA", transparent_rgba()[..., [0, 3]], "PNG"),
    ("RGBA", transparent_rgba(), "WEBP"),
])
def test_alpha_on_white_composites_transparent_pixels(mode, pixels, fmt):
    options = {"lossless": True} if fmt == "WEBP" else {}
    data = encoded(pixels, mode, fmt, **options)
    dropped, composited = run(data, size=(8, 16)), run(data, Fill(alpha="white"), size=(8, 16))
    np.testing.assert_array_equal(dropped[:, 8:], 0.0)  # the black stored under the transparency
    np.testing.assert_array_equal(composited[:, 8:], 1.0)
    np.testing.assert_array_equal(dropped[:, :8], composited[:, :8])  # opaque pixels untouched


def test_palette_transparency_and_half_alpha():
    palette = np.zeros((4, 4), np.uint8)
    palette[:, 2:] = 1
    data = encoded(palette, "P", transparency=0)
    composited = run(data, Fill(alpha="white"), size=(4, 4))
    np.testing.assert_array_equal(composited[:, :2], 1.0)
    np.testing.assert_allclose(composited[:, 2:], np.broadcast_to(np.array([200, 10, 10]) / 255.0, (4, 2, 3)))
    half = np.zeros((4, 4, 4), np.uint8)
    half[...] = (0, 100, 200, 128)
    mixed = run(encoded(half, "RGBA"), Fill(alpha="white"), size=(4, 4))
    expected = np.round(np.array([0, 100, 200]) * 128 / 255 + 255 * (1 - 128 / 255)) / 255
    np.testing.assert_allclose(mixed[0, 0], expected, atol=1e-6)


def test_white_fill_in_training_fills_what_rotation_uncovers(tmp_path):
    path = tmp_path / "black.png"
    path.write_bytes(encoded(np.zeros((16, 16, 3), np.uint8), "RGB"))
    augmentation = Augmentation(rotation_range=(45.0, 45.0))
    images = {}
    for padding in ("border", "white"):
        options = TrainingInput(16, 16, augmentation, seed=1, batch_size=1, max_image_pixels=LIMIT,
                                fill=Fill(padding=padding))
        batch = next(iter(training_dataset([str(path)], ["a"], ["a"], options, random_seed=0, start_position=0)))
        images[padding] = batch["image"].numpy()[0]
    np.testing.assert_array_equal(images["border"], 0.0)  # border replication of a black picture stays black
    assert images["white"][0, 0].tolist() == [1.0, 1.0, 1.0] and images["white"][8, 8].tolist() == [0.0, 0.0, 0.0]


def test_project_keys_reach_the_pipeline_and_bad_values_are_named(tmp_path):
    from deepdanbooru.errors import ConfigError
    from deepdanbooru.project.config import load_config

    (tmp_path / "project.json").write_text(json.dumps({"padding": "white", "alpha": "white"}))
    config = load_config(tmp_path)
    assert TrainingInput.from_config(config).fill == Fill("white", "white") == Fill.from_config(config)
    assert Fill.from_config(config, "drop") == Fill("white", "drop")
    (tmp_path / "project.json").write_text(json.dumps({}))
    assert TrainingInput.from_config(load_config(tmp_path)).fill == Fill()  # DeepDanbooru's
    (tmp_path / "project.json").write_text(json.dumps({"padding": "grey"}))
    with pytest.raises(ConfigError, match=r"project.json.*padding.*border, white"):
        load_config(tmp_path)


def test_evaluate_composites_alpha_onto_white_unless_told_to_drop_it(tmp_path):
    import keras
    from PIL import Image

    from deepdanbooru.cli import main

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Dense(2, activation="sigmoid")(keras.layers.GlobalAveragePooling2D()(inputs))
    keras.Model(inputs, outputs).save(tmp_path / "m.keras")
    (tmp_path / "tags.txt").write_text("a\nb\n")
    transparent = tmp_path / "t.png"
    Image.fromarray(transparent_rgba(16, 16), "RGBA").save(transparent)
    on_white = tmp_path / "w.png"
    Image.fromarray(np.where(transparent_rgba(16, 16)[..., 3:] == 0, 255, transparent_rgba(16, 16)[..., :3])
                    .astype(np.uint8), "RGB").save(on_white)
    black = tmp_path / "b.png"
    Image.fromarray(transparent_rgba(16, 16)[..., :3], "RGB").save(black)

    def scores(*options):
        result = CliRunner().invoke(main, ["evaluate", str(transparent), str(on_white), str(black), "--model-path",
                                           str(tmp_path / "m.keras"), "--tags-path", str(tmp_path / "tags.txt"),
                                           "--threshold", "0", "--format", "json", *options])
        assert result.exit_code == 0, result.output
        rows = {json.loads(line)["path"]: json.loads(line)["tags"] for line in result.stdout.strip().splitlines()}
        return rows[str(transparent)], rows[str(on_white)], rows[str(black)]

    white, opaque_white, opaque_black = scores()
    assert white == opaque_white and white != opaque_black
    dropped, _, _ = scores("--alpha", "drop")
    assert dropped == opaque_black


@pytest.mark.slow
def test_evaluate_padding_defaults_to_the_project_s_and_can_be_chosen(tmp_path, exported_project):
    import keras
    from PIL import Image

    from deepdanbooru.cli import main

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Dense(2, activation="sigmoid")(keras.layers.GlobalAveragePooling2D()(inputs))
    model = tmp_path / "m.keras"
    keras.Model(inputs, outputs).save(model)
    (tmp_path / "tags.txt").write_text("a\nb\n")
    project = exported_project(model, 16, "ab", padding="white")
    wide = tmp_path / "wide.png"
    Image.new("RGB", (16, 8), (0, 0, 0)).save(wide)  # black: padding with its border stays black

    def scores(*options):
        result = CliRunner().invoke(main, ["evaluate", str(wide), "--threshold", "0", "--format", "json",
                                           *map(str, options)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["tags"]

    alone = ("--model-path", model, "--tags-path", tmp_path / "tags.txt")
    border = scores(*alone)
    white = scores("--project-path", project)
    assert border != white
    assert scores(*alone, "--padding", "white") == white
    assert scores("--project-path", project, "--padding", "border") == border
    refused = CliRunner().invoke(main, ["evaluate", str(wide), *map(str, alone), "--padding", "grey"])
    assert refused.exit_code == 2 and "Invalid value for '--padding'" in refused.output


def test_fill_from_config_without_a_project_and_with_overrides(tmp_path):
    from deepdanbooru.project.config import load_config

    assert Fill.from_config(None) == Fill() and Fill.from_config(None, "white") == Fill("border", "white")
    assert Fill.from_config(None, padding="white") == Fill("white", "drop")
    (tmp_path / "project.json").write_text(json.dumps({"padding": "white"}))
    assert Fill.from_config(load_config(tmp_path), "white", "border") == Fill("border", "white")
