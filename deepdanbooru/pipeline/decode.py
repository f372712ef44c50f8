"""Encoded bytes -> RGB uint8, in-graph, with the format routed from the bytes and a pixel limit checked first."""

from __future__ import annotations

import tensorflow as tf

from deepdanbooru.pipeline.fill import WHITE, Fill
from deepdanbooru.pipeline.header import (
    JPEG, PNG, UNKNOWN, WEBP, WEBP_ALPHA_FLAG, declared_pixels, is_animated_webp, parse_header,
)

# libjpeg can decode at 1/2, 1/4 and 1/8 scale by truncating the DCT: far less work for large JPEGs.
JPEG_RATIOS = (1, 2, 4, 8)


def check_header(data, max_image_pixels):
    """(format, size, head) of `data`; raises InvalidArgumentError (in-graph) for unknown or oversized images."""
    image_format, size, head = parse_header(data)
    pixels = declared_pixels(size)
    known = tf.debugging.Assert(image_format != UNKNOWN, ["not an image: unrecognised file signature"])
    sized = tf.debugging.Assert(
        tf.logical_and(tf.reduce_all(size > 0), pixels <= max_image_pixels),
        ["declared size [height, width, frames]", size, "is empty or over max_image_pixels", max_image_pixels],
    )
    with tf.control_dependencies([known, sized]):
        return tf.identity(image_format), size, head


def jpeg_ratio_index(size, box):
    """Index into JPEG_RATIOS of the largest DCT scale that still leaves at least `box` (height, width) pixels."""
    # The image must be at least ratio times the size it is resized to along the limiting side.
    shrink = tf.reduce_max(tf.cast(size[:2], tf.float32) / box)
    return tf.reduce_sum(tf.cast(shrink >= tf.constant(JPEG_RATIOS[1:], tf.float32), tf.int64))


def _decode_generic(data):
    # JPEG (full size), PNG (any bit depth and colour type), GIF (first frame) and BMP.
    return tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)


def on_white(image):
    """uint8 [h, w, 1-4] (grey, grey + alpha, RGB, RGBA) -> RGB uint8 with the alpha composited onto white."""
    channels = tf.shape(image)[-1]
    colour = tf.cond(channels < 3, lambda: tf.tile(image[..., :1], [1, 1, 3]), lambda: image[..., :3])

    def composite():
        alpha = tf.cast(image[..., -1:], tf.float32) * (1.0 / 255.0)
        mixed = tf.cast(colour, tf.float32) * alpha + float(WHITE) * (1.0 - alpha)
        return tf.cast(tf.round(mixed), tf.uint8)

    # Two and four channels carry alpha.
    return tf.cond(tf.equal(channels % 2, 0), composite, lambda: colour)


def _decode_generic_on_white(data, image_format):
    # Only PNG's alpha is composited: a 32-bit BMP's fourth channel is often unused (and zero).
    return tf.cond(tf.equal(image_format, PNG),
                   lambda: on_white(tf.io.decode_image(data, channels=0, dtype=tf.uint8, expand_animations=False)),
                   lambda: _decode_generic(data))


def _decode_scaled_jpeg(data, ratio):
    return lambda: tf.io.decode_jpeg(data, channels=3, ratio=ratio)


def _decode_webp(data, head, alpha_on_white=False):
    keep = on_white if alpha_on_white else (lambda rgba: rgba[:, :, :3])

    def animated():
        # TensorFlow's animation path writes RGBA frames into a buffer sized from the alpha flag:
        # with the flag clear it corrupts memory and kills the process. Setting the flag (it only
        # describes the content) makes the decoder allocate four channels, which it fills.
        flags = tf.bitwise.bitwise_or(head[20], WEBP_ALPHA_FLAG)
        byte = tf.gather(tf.constant([bytes([value]) for value in range(256)]), flags)
        patched = tf.strings.join([tf.strings.substr(data, 0, 20), byte, tf.strings.substr(data, 21, -1)])
        return keep(tf.io.decode_webp(patched, channels=4)[0])

    def still():
        # channels=0 because a fixed count fails on files with (or without) alpha.
        return keep(tf.io.decode_webp(data, channels=0)[0])

    return tf.cond(is_animated_webp(head), animated, still)


def _decode_checked(data, head, image_format, ratio_index, alpha_on_white=False):
    """Branches: 0 generic (PNG, GIF, BMP, full-size JPEG), 1-3 DCT-scaled JPEG, 4 WebP."""
    if alpha_on_white:
        branches = [lambda: _decode_generic_on_white(data, image_format)]
    else:
        branches = [lambda: _decode_generic(data)]
    branches += [_decode_scaled_jpeg(data, ratio) for ratio in JPEG_RATIOS[1:]]
    branches += [lambda: _decode_webp(data, head, alpha_on_white)]
    index = tf.where(tf.equal(image_format, WEBP), tf.constant(4, tf.int64),
                     tf.where(tf.equal(image_format, JPEG), ratio_index, tf.constant(0, tf.int64)))
    return tf.ensure_shape(tf.switch_case(tf.cast(index, tf.int32), branches), [None, None, 3])


def decode_image_bytes(data, max_image_pixels, fill: Fill = Fill()):
    """Decode JPEG, PNG, GIF, BMP or WebP bytes (a scalar string tensor) to RGB uint8 [height, width, 3].

    Alpha is dropped (PNG and WebP alpha composited onto white with fill.alpha
    "white"), grayscale expanded, 16-bit reduced to 8, animations give their
    first frame. Unknown formats and images whose header declares more
    than `max_image_pixels` pixels raise InvalidArgumentError before any pixel
    is decoded. Works in graph mode (tf.data) and eagerly.
    """
    data = tf.convert_to_tensor(data, tf.string)
    image_format, _, head = check_header(data, max_image_pixels)
    return _decode_checked(data, head, image_format, tf.constant(0, tf.int64), fill.alpha_on_white)


def decode_for_box(data, max_image_pixels, box, dct_scaling=True, fill: Fill = Fill()):
    """Decode for a resize into `box` (height, width floats): large JPEGs come out DCT-scaled.

    Returns (image uint8 [h', w', 3], source size int64 [height, width]); the
    source size is that of the full image, so the resize that follows is the
    same whether or not the decoder scaled.
    """
    data = tf.convert_to_tensor(data, tf.string)
    image_format, size, head = check_header(data, max_image_pixels)
    ratio_index = jpeg_ratio_index(size, box) if dct_scaling else tf.constant(0, tf.int64)
    image = _decode_checked(data, head, image_format, ratio_index, fill.alpha_on_white)
    # Only JPEG has an exact header size; a GIF canvas may differ from its logical screen.
    source = tf.where(tf.equal(image_format, JPEG), size[:2], tf.shape(image, out_type=tf.int64)[:2])
    return image, source
