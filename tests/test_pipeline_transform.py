"""Geometry of the shared warp against numpy references, inference padding, and seeded determinism."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from deepdanbooru.pipeline import (  # noqa: E402
    TrainingInput, inference_dataset, training_dataset, warp_batch, warp_parameters,
)
from deepdanbooru.pipeline.transform import (  # noqa: E402
    Augmentation, augmentation_values, canvas_size, record_uniforms, seed_hash,
)

SIZE = 33  # odd: the centre is a pixel, so quarter turns are exact permutations


def _random_image(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _warp(image, output_size, **transform):
    """Warp one uint8 image (already at its fitted size) with the pipeline's kernel; float32 in [0, 1]."""
    content = tf.constant(image.shape[:2], tf.int32)
    parameters = warp_parameters(content, 1.0, output_size, **transform)
    result = warp_batch(tf.constant(image)[None], parameters[None], content[None], output_size, 4)
    return result[0].numpy()


def _edge_shift(image, dx, dy):
    """numpy reference: content moved right by dx and down by dy, border pixels replicated."""
    height, width = image.shape[:2]
    rows = np.clip(np.arange(height) - dy, 0, height - 1)
    cols = np.clip(np.arange(width) - dx, 0, width - 1)
    return image[rows][:, cols]


def test_identity_warp_copies_pixels_exactly():
    image = _random_image(SIZE, SIZE)
    np.testing.assert_allclose(_warp(image, (SIZE, SIZE)), image / 255.0, atol=1e-6)


@pytest.mark.parametrize("angle, quarter_turns", [(90.0, 1), (180.0, 2), (270.0, 3), (-90.0, 3)])
def test_rotation_by_quarter_turns_matches_numpy_rot90(angle, quarter_turns):
    image = _random_image(SIZE, SIZE, seed=1)
    # np.rot90 turns counter-clockwise as displayed, like a positive angle here.
    expected = np.rot90(image, quarter_turns) / 255.0
    np.testing.assert_allclose(_warp(image, (SIZE, SIZE), angle_degrees=angle), expected, atol=1e-3)


@pytest.mark.parametrize("dx, dy", [(3, 0), (0, -5), (4, 2)])
def test_pure_shift_by_whole_pixels_matches_numpy(dx, dy):
    image = _random_image(SIZE, SIZE + 6, seed=2)
    height, width = image.shape[:2]
    result = _warp(image, (height, width), shift=(dx / width, dy / height))
    np.testing.assert_allclose(result, _edge_shift(image, dx, dy) / 255.0, atol=1e-4)


def test_scale_two_doubles_pixels_about_the_centre():
    image = _random_image(SIZE, SIZE, seed=3).astype(np.float64)
    result = _warp(image.astype(np.uint8), (SIZE, SIZE), scale=2.0) * 255.0
    centre = SIZE // 2
    # Output pixel centre + 2k samples input centre + k exactly; the pixels between are the mean of two.
    for k in range(-7, 8):
        np.testing.assert_allclose(result[centre + 2 * k, centre], image[centre + k, centre], atol=0.02)
        np.testing.assert_allclose(result[centre, centre + 2 * k], image[centre, centre + k], atol=0.02)
    for k in range(-7, 7):
        between = (image[centre, centre + k] + image[centre, centre + k + 1]) / 2
        np.testing.assert_allclose(result[centre, centre + 2 * k + 1], between, atol=0.02)


def test_scale_half_takes_every_other_pixel_and_replicates_the_border():
    image = _random_image(SIZE, SIZE, seed=4)
    result = _warp(image, (SIZE, SIZE), scale=0.5)
    centre = SIZE // 2
    rows = np.clip(centre + 2 * (np.arange(SIZE) - centre), 0, SIZE - 1)
    expected = image[rows][:, rows] / 255.0
    np.testing.assert_allclose(result, expected, atol=1e-4)


def _write(tmp_path, name, array):
    path = tmp_path / name
    Image.fromarray(array).save(path)
    return str(path)


def _inference_images(paths, height, width, batch_size=4):
    batches = list(inference_dataset(paths, height=height, width=width, batch_size=batch_size,
                                     max_image_pixels=10**8))
    return np.concatenate([b["image"].numpy() for b in batches])


def test_inference_centres_a_wide_image_and_replicates_top_and_bottom_rows(tmp_path):
    image = _random_image(16, 32, seed=5)
    result = _inference_images([_write(tmp_path, "wide.png", image)], 32, 32)[0]
    # Fits without resizing; centred with floor(32 / 2) - floor(16 / 2) = 8 rows above.
    expected = np.pad(image, ((8, 8), (0, 0), (0, 0)), mode="edge") / 255.0
    np.testing.assert_allclose(result, expected, atol=1e-6)


def test_inference_area_resizes_a_tall_image_then_pads_left_and_right(tmp_path):
    image = _random_image(64, 32, seed=6)
    result = _inference_images([_write(tmp_path, "tall.png", image)], 32, 32)[0]
    # Area resize by exactly 1/2 is the mean of each 2x2 block, rounded to 8 bits.
    halved = np.round(image.astype(np.float64).reshape(32, 2, 16, 2, 3).mean(axis=(1, 3)))
    expected = np.pad(halved, ((0, 0), (8, 8), (0, 0)), mode="edge") / 255.0
    np.testing.assert_allclose(result, expected, atol=1.01 / 255)


def test_inference_enlarges_small_images_bilinearly_to_fill_the_box(tmp_path):
    image = np.zeros((8, 8, 3), np.uint8)
    image[:, 4:] = 200
    result = _inference_images([_write(tmp_path, "small.png", image)], 32, 32)[0]
    assert result.shape == (32, 32, 3)
    assert result[:, :10].max() == 0.0 and np.allclose(result[:, 22:], 200 / 255)
    middle = result[0, 10:22, 0]
    assert np.all(np.diff(middle) >= 0) and 0 < middle[5] < 200 / 255  # a ramp, not a hard copy


def test_training_without_augmentation_equals_inference(tmp_path):
    paths = [_write(tmp_path, f"{i}.png", _random_image(20 + 9 * i, 40, seed=i)) for i in range(3)]
    train = list(training_dataset(paths, [""] * 3, ["x"],
                                  TrainingInput(32, 32, Augmentation(None, [], None),
                                                seed=1, batch_size=4, max_image_pixels=10**8),
                                  random_seed=2, start_position=0))[0]["image"].numpy()
    np.testing.assert_array_equal(train, _inference_images(paths, 32, 32))


def test_canvas_size_rounds_up_without_float_noise():
    assert canvas_size(299, 299, 1.1) == (329, 329)
    assert canvas_size(32, 48, 1.0) == (32, 48)
    assert canvas_size(10, 10, 1.25) == (13, 13)


AUGMENTATION = Augmentation((0.0, 360.0), (0.9, 1.1), (-0.1, 0.1))


def _draw(seed, random_seed, position):
    uniforms = record_uniforms(seed_hash(seed, random_seed), position)
    scale, angle, shift = augmentation_values(uniforms, AUGMENTATION)
    return [float(scale), float(angle), float(shift[0]), float(shift[1])]


def test_random_warp_is_a_pure_function_of_seed_random_seed_and_position():
    assert _draw(0, 3, 17) == _draw(0, 3, 17)
    others = [_draw(1, 3, 17), _draw(0, 4, 17), _draw(0, 3, 18)]
    assert all(other != _draw(0, 3, 17) for other in others)
    scale, angle, dx, dy = _draw(5, 0, 123)
    assert 0.9 / 1.1 <= scale <= 1.0 and 0.0 <= angle <= 360.0 and -0.1 <= dx <= 0.1 and -0.1 <= dy <= 0.1


def _train(paths, start, *, seed=0, random_seed=0, parallel=tf.data.AUTOTUNE, batch_size=3):
    dataset = training_dataset(paths, ["a"] * len(paths), ["a"],
                               TrainingInput(24, 24, Augmentation((0.0, 360.0), (0.9, 1.1), (-0.1, 0.1)),
                                             seed=seed, batch_size=batch_size, max_image_pixels=10**8),
                               random_seed=random_seed, start_position=start, num_parallel_calls=parallel)
    images = {}
    for batch in dataset:
        for position, image in zip(batch["position"].numpy(), batch["image"].numpy()):
            images[int(position)] = image
    return images


@pytest.fixture(scope="module")
def record_paths(tmp_path_factory):
    directory = tmp_path_factory.mktemp("records")
    return [_write(directory, f"{i}.jpg", _random_image(30 + i, 40 - i, seed=10 + i)) for i in range(7)]


def test_same_record_at_same_position_gets_same_pixels_in_any_slice_and_parallelism(record_paths):
    whole = _train(record_paths, 100)
    assert sorted(whole) == list(range(100, 107))
    # The same records re-sliced (as after a resume) and decoded one at a time.
    tail = _train(record_paths[4:], 104, parallel=1, batch_size=2)
    for position in range(104, 107):
        np.testing.assert_array_equal(tail[position], whole[position])
    again = _train(record_paths, 100, parallel=1, batch_size=7)
    for position in whole:
        np.testing.assert_array_equal(again[position], whole[position])


def test_datasets_run_without_the_autotuning_model(record_paths):
    # Its thread made destroying a finished iterator wait up to a minute (pipeline/dataset.py).
    train = training_dataset(record_paths, ["a"] * 7, ["a"],
                             TrainingInput(24, 24, Augmentation(None, None, None),
                                           seed=0, batch_size=3, max_image_pixels=10**8),
                             random_seed=0, start_position=0)
    infer = inference_dataset(record_paths, height=24, width=24, batch_size=3, max_image_pixels=10**8)
    for dataset in (train, infer):
        assert dataset.options().autotune.enabled is False
        assert sum(int(batch["image"].shape[0]) for batch in dataset) == 7


def test_different_random_seed_or_position_gives_different_pixels(record_paths):
    base = _train(record_paths, 0)
    next_epoch = _train(record_paths, 0, random_seed=1)
    moved = _train(record_paths, 50)
    other_seed = _train(record_paths, 0, seed=9)
    for other in (next_epoch, other_seed):
        assert all(np.abs(other[p] - base[p]).max() > 0.05 for p in base)
    assert all(np.abs(moved[p + 50] - base[p]).max() > 0.05 for p in base)


def test_single_image_preprocessing_equals_the_inference_dataset(tmp_path):
    from deepdanbooru.pipeline import preprocess_for_inference

    path = _write(tmp_path, "one.png", _random_image(50, 23, seed=8))
    with open(path, "rb") as handle:
        single = preprocess_for_inference(handle.read(), height=32, width=32, max_image_pixels=10**6).numpy()
    np.testing.assert_array_equal(single, _inference_images([path], 32, 32)[0])
