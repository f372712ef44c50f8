"""The packed pictures' OpenCV warp against the XLA warp original files take: same maps, same conventions."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("cv2")

from deepdanbooru.pipeline.fill import Fill  # noqa: E402
from deepdanbooru.pipeline.picturewarp import (  # noqa: E402
    decode_and_warp_batch, packed_size, warp_array, warp_packed_batch,
)
from deepdanbooru.pipeline.transform import (  # noqa: E402
    Augmentation, drawn_parameters, record_uniforms, seed_hash, warp_batch,
)


def _drawing(height, width, seed=0):
    """Smooth colour with sharp one-pixel lines: the worst case for sub-pixel sampling differences."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    image = np.stack([128 + 90 * np.sin(xs / (7 + c) + ys / 11) for c in range(3)], axis=-1)
    for _ in range(12):
        image[rng.integers(0, height), :] = rng.integers(0, 256, 3)
        image[:, rng.integers(0, width)] = rng.integers(0, 256, 3)
    return np.clip(image, 0, 255).astype(np.uint8)


AUGMENTATIONS = {
    "none": None,
    "default": Augmentation((0.0, 360.0), (0.9, 1.1), (-0.1, 0.1)),
    "flip and crop": Augmentation((-30.0, 30.0), (0.8, 1.2), (-0.2, 0.2), horizontal_flip=True,
                                  crop_area_range=(0.5, 1.0)),
}


@pytest.mark.parametrize("white", [False, True], ids=["border", "white"])
@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_the_opencv_warp_draws_what_the_xla_warp_draws_to_a_few_levels(name, white):
    augmentation = AUGMENTATIONS[name]
    image = _drawing(45, 38, seed=len(name))
    output = (40, 40)
    count = 8
    size = tf.constant([image.shape[:2]] * count, tf.int32)
    zoom = tf.fill([count], 1.05)
    uniforms = tf.stack([record_uniforms(seed_hash(3, 4), position, 8) for position in range(count)])
    parameters = drawn_parameters(size, zoom, uniforms, output, augmentation)
    xla = warp_batch(tf.constant(np.stack([image] * count)), parameters, size, output, count,
                     fill=Fill(padding="white" if white else "border")).numpy() * 255
    for n in range(count):
        opencv = warp_array(image, parameters[n].numpy(), output, white).astype(np.float32)
        difference = np.abs(opencv - xla[n])
        # OpenCV places samples to 1/32 of a pixel and rounds to whole levels: across a one-pixel line of
        # contrast 255 that moves a value by up to about 4 levels, elsewhere by well under one. (This
        # picture is a quarter lines, so its mean, 0.36-0.61 measured, is far above a drawing's.)
        assert difference.max() <= 6.0, (n, difference.max())
        assert difference.mean() <= 0.8, (n, difference.mean())


def test_white_padding_is_white_and_border_padding_repeats_the_edge():
    image = np.full((10, 10, 3), 40, np.uint8)
    image[:, -1] = 200  # the right column
    shifted = np.array([1.0, 0.0, 0.0, 1.0, 5.0, 0.0])  # output x samples input x + 5: the right half is outside
    border = warp_array(image, shifted, (10, 10))
    white = warp_array(image, shifted, (10, 10), white=True)
    np.testing.assert_array_equal(border[:, 4:], 200)
    np.testing.assert_array_equal(white[:, 5:], 255)
    np.testing.assert_array_equal(white[:, :4], 40)


def test_packed_pictures_decode_as_accurate_decode_jpeg_and_an_identity_map_copies_them():
    image = _drawing(30, 40, seed=5)
    data = tf.io.encode_jpeg(image, quality=95).numpy()
    decoded = tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    identity = np.array([[1.0, 0.0, 0.0, 1.0, 0.0, 0.0]] * 2)
    pictures, ok = decode_and_warp_batch([data, data], identity, (30, 40))
    np.testing.assert_array_equal(pictures, [decoded, decoded])
    assert ok.tolist() == [True, True]
    # In the graph: a picture that fits its box exactly is zoomed by 1 and centred, so it comes out as it is.
    size, zoom = packed_size(tf.constant(data), (30.0, 40.0))
    assert size.numpy().tolist() == [30, 40] and zoom.numpy() == 1.0
    pictures, ok = warp_packed_batch(tf.constant([data]), size[None], zoom[None], tf.zeros([1, 4]), (30, 40), None)
    np.testing.assert_array_equal(pictures.numpy()[0], decoded)


def _undecodable_jpeg(data: bytes) -> bytes:
    """`data` whose scan asks for Huffman tables 3, which it does not define: the header reads, decoding fails."""
    at = data.index(b"\xff\xda") + 6  # the marker, the length, the component count, the first component's id
    return data[:at] + b"\x33" + data[at + 1:]


def test_a_picture_that_cannot_be_decoded_is_marked_and_the_others_warped():
    image = _drawing(20, 20, seed=6)
    data = tf.io.encode_jpeg(image, quality=90).numpy()
    broken = _undecodable_jpeg(data)
    assert tf.io.extract_jpeg_shape(broken).numpy().tolist() == [20, 20, 3]
    identity = np.array([[1.0, 0.0, 0.0, 1.0, 0.0, 0.0]] * 3)
    pictures, ok = decode_and_warp_batch([data, broken, data], identity, (20, 20))
    assert ok.tolist() == [True, False, True]
    assert pictures[1].max() == 0 and pictures[0].max() > 0
