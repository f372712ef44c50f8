"""Every supported format decodes to RGB of the right shape and colours; the format comes from the bytes."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from pipeline_images import HEIGHT, WIDTH, encoded_variants, quadrant_image, quadrant_means  # noqa: E402

from deepdanbooru.pipeline import FORMAT_NAMES, decode_image_bytes, image_header, inference_dataset  # noqa: E402
from deepdanbooru.pipeline.decode import decode_for_box  # noqa: E402

VARIANTS = encoded_variants(quadrant_image())


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_format_decodes_to_rgb_with_the_right_shape_and_colours(name):
    data, expected, tolerance = VARIANTS[name]
    image = decode_image_bytes(tf.constant(data), 10**6).numpy()
    assert image.dtype == np.uint8 and image.shape == (HEIGHT, WIDTH, 3)
    difference = np.abs(quadrant_means(image) - quadrant_means(expected)).max()
    assert difference <= tolerance, f"{name}: quadrant colours off by {difference:.1f} levels"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_header_names_the_format_and_declares_the_size(name):
    image_format, size = image_header(tf.constant(VARIANTS[name][0]))
    assert FORMAT_NAMES[int(image_format)] == name.split("_")[0]
    height, width, frames = size.numpy().tolist()
    assert (height, width) == (HEIGHT, WIDTH)
    assert frames == (3 if "animated" in name else 1)


@pytest.mark.parametrize("name", ["webp_animated", "webp_animated_lossy"])
def test_animated_webp_fixture_exercises_the_alpha_less_animation_path(name):
    # TF 2.21's decode_webp kills the process on an animated WebP without alpha (VP8X with the animation
    # flag and no alpha flag) unless asked for 4 channels: these fixtures must hit that path.
    data = VARIANTS[name][0]
    assert data[12:16] == b"VP8X" and data[20] & 0x02 and not data[20] & 0x10


@pytest.mark.slow
def test_animated_webp_decodes_in_a_child_process_without_crashing(tmp_path):
    # In a child process: a regression would kill pytest itself otherwise.
    names = ("webp_animated", "webp_animated_lossy", "webp_animated_alpha", "webp_alpha", "webp_lossy")
    for name in names:
        (tmp_path / f"{name}.webp").write_bytes(VARIANTS[name][0])
    script = textwrap.dedent(f"""
        import glob
        from deepdanbooru.pipeline import inference_dataset
        paths = sorted(glob.glob({str(tmp_path)!r} + "/*.webp"))
        batch = next(iter(inference_dataset(paths, height=24, width=24, batch_size=8, max_image_pixels=10**6)))
        print("decoded", batch["image"].shape[0], "of", len(paths))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=str(Path(__file__).resolve().parents[1]))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"decoded {len(names)} of {len(names)}" in result.stdout


def test_format_is_sniffed_from_bytes_not_extension(tmp_path):
    swapped = {"jpeg_in.png": VARIANTS["jpeg_baseline"][0], "png_in.jpg": VARIANTS["png_rgb"][0],
               "webp_in.gif": VARIANTS["webp_lossless"][0], "gif_in.bmp": VARIANTS["gif_animated"][0]}
    paths = []
    for name, data in swapped.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    batch = next(iter(inference_dataset(paths, height=HEIGHT, width=WIDTH, batch_size=8, max_image_pixels=10**6)))
    assert batch["position"].numpy().tolist() == [0, 1, 2, 3]
    for image in batch["image"].numpy():
        expected = quadrant_means(quadrant_image())
        assert np.abs(quadrant_means(image * 255.0) - expected).max() <= 12


def _png_header_only(width, height):
    """A PNG signature and a valid IHDR chunk declaring width x height, with no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk


def test_oversized_header_is_refused_before_decoding():
    # 60000 x 60000 RGB would need 10.8 GB if a decoder allocated it.
    data = _png_header_only(60000, 60000)
    _, size = image_header(tf.constant(data))
    assert size.numpy().tolist() == [60000, 60000, 1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_image_pixels"):
        decode_image_bytes(tf.constant(data), 89_478_485)


@pytest.mark.parametrize("name", ["jpeg_baseline", "png_rgb", "gif_animated", "bmp", "webp_lossy",
                                  "webp_lossless", "webp_animated"])
def test_pixel_limit_applies_to_every_format(name):
    data = VARIANTS[name][0]
    limit = HEIGHT * WIDTH * (3 if "animated" in name else 1)
    assert decode_image_bytes(tf.constant(data), limit).shape == (HEIGHT, WIDTH, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_image_pixels"):
        decode_image_bytes(tf.constant(data), limit - 1)


def test_gif_frame_larger_than_its_logical_screen_counts_in_full():
    # TensorFlow's GIF canvas spans the frames; a tiny logical screen must not hide a large frame.
    buffer = io.BytesIO()
    Image.fromarray(quadrant_image(20, 30)).convert("P").save(buffer, format="GIF")
    data = bytearray(buffer.getvalue())
    data[6:10] = bytes([5, 0, 4, 0])  # logical screen 5 x 4
    assert image_header(tf.constant(bytes(data)))[1].numpy().tolist() == [20, 30, 1]
    assert decode_image_bytes(tf.constant(bytes(data)), 600).shape == (20, 30, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_image_pixels"):
        decode_image_bytes(tf.constant(bytes(data)), 599)


def test_unknown_bytes_are_refused():
    with pytest.raises(tf.errors.InvalidArgumentError, match="not an image"):
        decode_image_bytes(tf.constant(b"this is a text file, not a picture"), 10**6)
    with pytest.raises(tf.errors.InvalidArgumentError):
        decode_image_bytes(tf.constant(b""), 10**6)


def test_large_jpeg_is_decoded_at_reduced_scale_for_a_small_box():
    buffer = io.BytesIO()
    Image.fromarray(quadrant_image(400, 640)).save(buffer, format="JPEG", quality=90)
    data = tf.constant(buffer.getvalue())
    scaled, source = decode_for_box(data, 10**7, (48.0, 48.0))
    assert source.numpy().tolist() == [400, 640]
    assert scaled.shape == (400 // 8, 640 // 8, 3)  # 640 / 48 >= 8: 1/8 scale
    full, _ = decode_for_box(data, 10**7, (48.0, 48.0), dct_scaling=False)
    assert full.shape == (400, 640, 3)
    half, _ = decode_for_box(data, 10**7, (300.0, 300.0))
    assert half.shape == (200, 320, 3)  # 640 / 300 = 2.1: 1/2 scale, still larger than the box
