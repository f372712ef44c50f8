"""The augmentation keys: horizontal flip, random resized crop and mixup, and defaults that change nothing."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from deepdanbooru.errors import ConfigError  # noqa: E402
from deepdanbooru.pipeline import (  # noqa: E402
    Augmentation,
    TrainingInput,
    training_dataset,
    warp_batch,
    warp_parameters,
)
from deepdanbooru.pipeline.mixup import mixup_weight  # noqa: E402
from deepdanbooru.pipeline.transform import flip_horizontally, record_uniforms, seed_hash  # noqa: E402
from deepdanbooru.project.config import load_config  # noqa: E402

TAGS = ["a", "b", "c"]
TAG_STRINGS = ["a", "b c", "", "a c", "c"]


def _write(directory, name, array):
    path = directory / name
    Image.fromarray(array).save(path)
    return str(path)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Five PNGs of different sizes (lossless, so decoding is exact everywhere)."""
    directory = tmp_path_factory.mktemp("augment")
    return [_write(directory, f"{i}.png", np.random.default_rng(10 + i).integers(
        0, 256, (30 + 3 * i, 40 - 2 * i, 3), dtype=np.uint8)) for i in range(5)]


def _batches(paths, *, size=24, batch_size=2, rotation_range=(0.0, 360.0), scale_range=(0.9, 1.1),
             shift_range=(-0.1, 0.1), start_position=10, horizontal_flip=False, crop_area_range=None, mixup=None):
    strings = (TAG_STRINGS * len(paths))[:len(paths)]
    augmentation = Augmentation(rotation_range, scale_range, shift_range, horizontal_flip, crop_area_range)
    options = TrainingInput(size, size, augmentation, seed=3, batch_size=batch_size, max_image_pixels=10**8,
                            mixup=mixup)
    return list(training_dataset(paths, strings, TAGS, options, random_seed=1, start_position=start_position))


def _by_position(batches, key="image"):
    return {int(p): value for batch in batches
            for p, value in zip(batch["position"].numpy(), batch[key].numpy())}


# sha256 of every batch's image and label bytes of _batches(records) with DeepDanbooru's augmentation, recorded
# with the pipeline as it was before the flip, crop and mixup keys existed (commit 3a37e87). The new keys at their
# defaults must not move a bit.
BEFORE_THE_AUGMENTATION_KEYS = "179036e49ab15fbf560af83fadbe87f2ec357217c29bf118258c44c9fbd96ef1"


def test_defaults_give_the_pipeline_output_of_before_the_new_keys(records):
    digest = hashlib.sha256()
    for batch in _batches(records, horizontal_flip=False, crop_area_range=None, mixup=None):
        digest.update(batch["image"].numpy().tobytes())
        digest.update(batch["label"].numpy().tobytes())
    assert digest.hexdigest() == BEFORE_THE_AUGMENTATION_KEYS


def test_the_new_draws_leave_deepdanbooru_s_four_unchanged():
    hashed = seed_hash(3, 1)
    for position in (0, 7, 12345):
        base = record_uniforms(hashed, position).numpy()
        extended = record_uniforms(hashed, position, 8).numpy()
        np.testing.assert_array_equal(extended[:4], base)
        assert len(set(extended[4:]) & set(base)) == 0


def test_flipped_identity_warp_is_numpy_fliplr():
    image = np.random.default_rng(1).integers(0, 256, (17, 20, 3), dtype=np.uint8)
    content = tf.constant([17, 20], tf.int32)
    parameters = warp_parameters(content, 1.0, (17, 20))[None]
    flipped = flip_horizontally(parameters, tf.constant([True]), 20)
    kept = flip_horizontally(parameters, tf.constant([False]), 20)
    warp = lambda p: warp_batch(tf.constant(image)[None], p, content[None], (17, 20), 2)[0].numpy()  # noqa: E731
    scaled = image.astype(np.float32) * np.float32(1.0 / 255.0)  # the kernel multiplies by 1/255
    np.testing.assert_array_equal(warp(kept), scaled)
    np.testing.assert_array_equal(warp(flipped), np.fliplr(scaled))


def test_horizontal_flip_mirrors_about_half_the_records_exactly(records):
    paths = records * 4  # 20 records: positions 10..29
    still = dict(batch_size=8, rotation_range=None, scale_range=None, shift_range=None)
    plain = _by_position(_batches(paths, **still))
    flips = _by_position(_batches(paths, horizontal_flip=True, **still))
    mirrored = 0
    for position, image in flips.items():
        if np.array_equal(image, plain[position]):
            continue
        np.testing.assert_array_equal(image, plain[position][:, ::-1])
        mirrored += 1
    assert 4 <= mirrored <= 16
    # A pure function of the position, whatever the slicing (as after a resume).
    again = _by_position(_batches(paths[3:], start_position=13, horizontal_flip=True, **still))
    for position, image in again.items():
        np.testing.assert_array_equal(image, flips[position])


def test_crop_of_the_whole_area_changes_nothing(records):
    whole = _batches(records, crop_area_range=(1.0, 1.0))
    plain = _batches(records)
    for a, b in zip(whole, plain):
        np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())


def test_crop_samples_a_full_resolution_window_inside_the_image(tmp_path):
    # A 64x64 ramp (red = 2x, green = 2y): a quarter-area crop into 32x32 is a 1:1 window of the original, so
    # the output is still a ramp of slope 2 whose start is the window's offset, between 0 and 32 pixels.
    ys, xs = np.mgrid[0:64, 0:64]
    ramp = np.stack([2 * xs, 2 * ys, np.full_like(xs, 7)], axis=-1).astype(np.uint8)
    paths = [_write(tmp_path, "ramp.png", ramp)] * 6
    options = TrainingInput(32, 32, Augmentation(crop_area_range=(0.25, 0.25)), seed=0, batch_size=6,
                            max_image_pixels=10**8)
    batches = list(training_dataset(paths, ["a"] * 6, ["a"], options, random_seed=0, start_position=0))
    offsets = set()
    for image in batches[0]["image"].numpy() * 255:
        red, green = image[..., 0], image[..., 1]
        np.testing.assert_allclose(np.diff(red, axis=1), 2.0, atol=1e-3)
        np.testing.assert_allclose(np.diff(green, axis=0), 2.0, atol=1e-3)
        x0, y0 = red[0, 0] / 2, green[0, 0] / 2
        assert 0.0 <= x0 <= 32.0 and 0.0 <= y0 <= 32.0
        offsets.add((round(float(x0), 2), round(float(y0), 2)))
    assert len(offsets) == 6  # every record its own window


def test_mixup_mixes_each_record_with_its_mirror_in_the_batch_with_a_seeded_weight(records):
    alpha = 0.4
    plain = _batches(records, batch_size=4)
    mixed = _batches(records, batch_size=4, mixup=alpha)
    hashed = seed_hash(3, 1)
    weights = []
    for before, after in zip(plain, mixed):
        positions = before["position"].numpy()
        w = np.array([float(mixup_weight(hashed, p, alpha)) for p in positions], np.float32)
        weights.extend(w)
        for key, shape in (("image", (-1, 1, 1, 1)), ("label", (-1, 1))):
            x = before[key].numpy()
            expected = x[::-1] + (x - x[::-1]) * w.reshape(shape)
            np.testing.assert_allclose(after[key].numpy(), expected, atol=1e-6)
    assert all(0.0 <= w <= 1.0 for w in weights) and len(set(weights)) == len(weights)
    # Labels become soft but stay in [0, 1], and the weight is a pure function of the position.
    assert float(mixup_weight(hashed, 12, alpha)) == float(mixup_weight(hashed, 12, alpha))
    labels = np.concatenate([b["label"].numpy() for b in mixed])
    assert labels.min() >= 0.0 and labels.max() <= 1.0 and ((labels > 0) & (labels < 1)).any()


@pytest.mark.parametrize("key, value, message", [
    ("horizontal_flip", "yes", "horizontal_flip: must be true or false"),
    ("crop_area_range", [0.0, 1.0], "crop_area_range: low must be > 0"),
    ("crop_area_range", [0.5, 1.2], "crop_area_range: high must be <= 1"),
    ("crop_area_range", [0.9, 0.8], "crop_area_range: low must be <= high"),
    ("mixup", 0, "mixup: must be > 0"),
    ("mixup", "0.2", "mixup: must be a number"),
])
def test_bad_augmentation_values_name_the_file_and_key(tmp_path, key, value, message):
    (tmp_path / "project.json").write_text(json.dumps({key: value}))
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path)
    assert str(error.value).startswith(f"{tmp_path / 'project.json'}: {message}")


def test_augmentation_keys_default_off_and_parse(tmp_path):
    (tmp_path / "project.json").write_text("{}")
    config = load_config(tmp_path)
    assert (config.horizontal_flip, config.crop_area_range, config.mixup) == (False, None, None)
    (tmp_path / "project.json").write_text(json.dumps(
        {"horizontal_flip": True, "crop_area_range": [0.87, 1], "mixup": 0.2}))
    config = load_config(tmp_path)
    assert (config.horizontal_flip, config.crop_area_range, config.mixup) == (True, (0.87, 1.0), 0.2)


def test_training_input_takes_the_new_keys_from_project_json(tmp_path):
    (tmp_path / "project.json").write_text("{}")
    plain = TrainingInput.from_config(load_config(tmp_path))
    assert plain.mixup is None and plain.augmentation == Augmentation((0, 360), (0.9, 1.1), (-0.1, 0.1))
    (tmp_path / "project.json").write_text(json.dumps(
        {"horizontal_flip": True, "crop_area_range": [0.87, 1], "mixup": 0.2, "rotation_range": None}))
    options = TrainingInput.from_config(load_config(tmp_path))
    assert options.mixup == 0.2
    assert options.augmentation == Augmentation(None, (0.9, 1.1), (-0.1, 0.1), True, (0.87, 1.0))
