"""Encoded bytes -> RGB uint8, in-graph, with the format routed from the bytes and a pixel limit checked first."""

from __future__ import annotations

import tensorflow as tf

from deepdanbooru.pipeline.header import (
    JPEG, UNKNOWN, WEBP, WEBP_ALPHA_FLAG, declared_pixels, head_bytes, image_header, is_animated_webp,
)

# libjpeg can decode at 1/2, 1/4 and 1/8 scale by truncating the DCT: far less work for large JPEGs.
JPEG_RATIOS = (1, 2, 4, 8)


def check_header(data, max_image_pixels):
    """Format and declared size of `data`; raises InvalidArgumentError (in-graph) for unknown or oversized images."""
    image_format, size = image_header(data)
    pixels = declared_pixels(size)
    known = tf.debugging.Assert(image_format != UNKNOWN, ["not an image: unrecognised file signature"])
    sized = tf.debugging.Assert(
        tf.logical_and(tf.reduce_all(size > 0), pixels <= max_image_pixels),
        ["declared size [height, width, frames]", size, "is empty or over max_image_pixels", max_image_pixels],
    )
    with tf.control_dependencies([known, sized]):
        return tf.identity(image_format), tf.identity(size)


def jpeg_ratio_index(size, box):
    """Index into JPEG_RATIOS of the largest DCT scale that still leaves at least `box` (height, width) pixels."""
    height = tf.cast(size[0], tf.float32)
    width = tf.cast(size[1], tf.float32)
    # The image must be at least ratio times the size it is resized to along the limiting side.
    shrink = tf.maximum(height / box[0], width / box[1])
    return tf.reduce_sum(tf.cast(shrink >= tf.constant(JPEG_RATIOS[1:], tf.float32), tf.int32))


def _decoder_index(image_format, animated_webp, ratio_index):
    """Branch of _decode_checked: 0 generic (PNG, GIF, BMP, full-size JPEG), 1-3 scaled JPEG, 4-5 WebP."""
    webp = tf.where(animated_webp, 5, 4)
    return tf.where(tf.equal(image_format, WEBP), webp, tf.where(tf.equal(image_format, JPEG), ratio_index, 0))


def _decode_generic(data):
    # JPEG (full size), PNG (any bit depth and colour type), GIF (first frame) and BMP.
    return tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)


def _decode_scaled_jpeg(data, ratio):
    return lambda: tf.io.decode_jpeg(data, channels=3, ratio=ratio)


def _decode_animated_webp(data, head):
    # TensorFlow's animation path writes RGBA frames into a buffer sized from the alpha flag:
    # with the flag clear it corrupts memory and kills the process. Setting the flag (it only
    # describes the content) makes the decoder allocate four channels, which it fills.
    flags = tf.bitwise.bitwise_or(head[20], WEBP_ALPHA_FLAG)
    byte = tf.gather(tf.constant([bytes([value]) for value in range(256)]), flags)
    patched = tf.strings.join([tf.strings.substr(data, 0, 20), byte, tf.strings.substr(data, 21, -1)])
    return tf.io.decode_webp(patched, channels=4)[0, :, :, :3]


def _decode_checked(data, image_format, ratio_index):
    head = head_bytes(data)
    branches = [lambda: _decode_generic(data)]
    branches += [_decode_scaled_jpeg(data, ratio) for ratio in JPEG_RATIOS[1:]]
    branches += [
        lambda: tf.io.decode_webp(data, channels=0)[0, :, :, :3],
        lambda: _decode_animated_webp(data, head),
    ]
    index = _decoder_index(image_format, is_animated_webp(head), ratio_index)
    return tf.ensure_shape(tf.switch_case(index, branches), [None, None, 3])


def decode_image_bytes(data, max_image_pixels):
    """Decode JPEG, PNG, GIF, BMP or WebP bytes (a scalar string tensor) to RGB uint8 [height, width, 3].

    Alpha is dropped, grayscale expanded, 16-bit reduced to 8, animations give
    their first frame. Unknown formats and images whose header declares more
    than `max_image_pixels` pixels raise InvalidArgumentError before any pixel
    is decoded. Works in graph mode (tf.data) and eagerly.
    """
    data = tf.convert_to_tensor(data, tf.string)
    image_format, _ = check_header(data, max_image_pixels)
    return _decode_checked(data, image_format, tf.constant(0))


def decode_for_box(data, max_image_pixels, box, dct_scaling=True):
    """Decode for a resize into `box` (height, width floats): large JPEGs come out DCT-scaled.

    Returns (image uint8 [h', w', 3], source size int64 [height, width]); the
    source size is that of the full image, so the resize that follows is the
    same whether or not the decoder scaled.
    """
    data = tf.convert_to_tensor(data, tf.string)
    image_format, size = check_header(data, max_image_pixels)
    ratio_index = tf.constant(0)
    if dct_scaling:
        ratio_index = tf.where(tf.equal(image_format, JPEG), jpeg_ratio_index(size, box), 0)
    image = _decode_checked(data, image_format, ratio_index)
    decoded = tf.cast(tf.shape(image)[:2], tf.int64)
    # Only JPEG has an exact header size; a GIF canvas may differ from its logical screen.
    source = tf.where(tf.equal(image_format, JPEG), size[:2], decoded)
    return image, source
