"""Image format and declared size, read in-graph from the first bytes before anything is decoded.

The format comes from the file signature, never from the extension. The size is
what the header declares, so an oversized image (a decompression bomb) can be
refused before a decoder allocates its pixels.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

UNKNOWN, JPEG, PNG, GIF, BMP, WEBP = range(6)
FORMAT_NAMES = ("unknown", "jpeg", "png", "gif", "bmp", "webp")

_HEAD_BYTES = 32
# VP8X flag bits (byte 20 of a WebP file).
WEBP_ANIMATION_FLAG = 0x02
WEBP_ALPHA_FLAG = 0x10


# Byte patterns: name -> (offset, bytes). All are tested at once against the first bytes.
_SIGNATURES = {
    "jpeg": (0, b"\xff\xd8\xff"),
    "png": (0, b"\x89PNG\r\n\x1a\n"),
    "gif": (0, b"GIF8"),
    "bmp": (0, b"BM"),
    "riff": (0, b"RIFF"),
    "webp": (8, b"WEBP"),
    "png_ihdr": (12, b"IHDR"),
    "webp_lossy": (12, b"VP8 "),
    "webp_lossless": (12, b"VP8L"),
    "webp_extended": (12, b"VP8X"),
    "lossy_start_code": (23, b"\x9d\x01\x2a"),
    "lossless_signature": (20, b"\x2f"),
}
# Integer fields: name -> (offset, byte count, big endian). All are read at once.
_FIELDS = {
    "png_width": (16, 4, True),
    "png_height": (20, 4, True),
    "gif_width": (6, 2, False),
    "gif_height": (8, 2, False),
    "bmp_header_size": (14, 4, False),
    "bmp_core_width": (18, 2, False),
    "bmp_core_height": (20, 2, False),
    "bmp_width": (18, 4, False),
    "bmp_height": (22, 4, False),
    "lossy_width": (26, 2, False),
    "lossy_height": (28, 2, False),
    "lossless_bits": (21, 4, False),
    "extended_width": (24, 3, False),
    "extended_height": (27, 3, False),
    "extended_flags": (20, 1, False),
}


def _signature_tables():
    pattern = np.zeros((len(_SIGNATURES), _HEAD_BYTES), np.int64)
    mask = np.zeros((len(_SIGNATURES), _HEAD_BYTES), bool)
    for row, (offset, signature) in enumerate(_SIGNATURES.values()):
        pattern[row, offset:offset + len(signature)] = list(signature)
        mask[row, offset:offset + len(signature)] = True
    return pattern, mask


def _field_tables():
    index = np.zeros((len(_FIELDS), 4), np.int64)
    shift = np.zeros((len(_FIELDS), 4), np.int64)
    used = np.zeros((len(_FIELDS), 4), np.int64)
    for row, (offset, size, big_endian) in enumerate(_FIELDS.values()):
        for i in range(size):
            index[row, i] = offset + i
            shift[row, i] = 8 * (size - 1 - i if big_endian else i)
            used[row, i] = 1
    return index, shift, used


_PATTERN, _MASK = _signature_tables()
_INDEX, _SHIFT, _USED = _field_tables()


def head_bytes(data):
    """The first bytes of `data` as int64 [32], zero-padded."""
    raw = tf.io.decode_raw(tf.strings.substr(data, 0, _HEAD_BYTES), tf.uint8)
    raw = tf.pad(raw, [[0, _HEAD_BYTES - tf.size(raw)]])
    return tf.cast(raw, tf.int64)


def _signatures(head):
    hits = tf.logical_or(tf.equal(head[None, :], _PATTERN), ~_MASK)
    return dict(zip(_SIGNATURES, tf.unstack(tf.reduce_all(hits, axis=1))))


def _fields(head):
    values = tf.reduce_sum(tf.bitwise.left_shift(tf.gather(head, _INDEX), _SHIFT) * _USED, axis=1)
    return dict(zip(_FIELDS, tf.unstack(values)))


def sniff_format(head):
    found = _signatures(head)
    flags = tf.cast(tf.stack([
        found["jpeg"], found["png"], found["gif"], found["bmp"], tf.logical_and(found["riff"], found["webp"]),
    ]), tf.int32)
    return tf.reduce_sum(flags * tf.constant([JPEG, PNG, GIF, BMP, WEBP]))


def is_animated_webp(head):
    found = _signatures(head)
    flags = _fields(head)["extended_flags"]
    return tf.logical_and(found["webp_extended"], tf.bitwise.bitwise_and(flags, WEBP_ANIMATION_FLAG) != 0)


def _size(height, width, frames=1):
    return tf.stack([tf.cast(height, tf.int64), tf.cast(width, tf.int64), tf.cast(frames, tf.int64)])


def _webp_frames(data, animated):
    def count():
        # Every ANMF chunk is one frame and TensorFlow decodes them all; the tag may also occur
        # inside compressed data, which only overestimates, so the guard errs on the safe side.
        return tf.maximum(tf.cast(tf.size(tf.strings.split(data, "ANMF")), tf.int64) - 1, 1)

    return tf.cond(animated, count, lambda: tf.constant(1, tf.int64))


def _fixed_offset_sizes(data, head):
    """[6, 3] sizes for UNKNOWN, (JPEG: filled in elsewhere), PNG, GIF, BMP, WEBP from fixed offsets."""
    found, field = _signatures(head), _fields(head)
    zero = _size(0, 0)
    png = tf.where(found["png_ihdr"], _size(field["png_height"], field["png_width"]), zero)
    gif = _size(field["gif_height"], field["gif_width"])  # the logical screen
    core = tf.equal(field["bmp_header_size"], 12)  # BITMAPCOREHEADER has 16-bit sizes
    bmp = tf.where(core, _size(field["bmp_core_height"], field["bmp_core_width"]),
                   _size(tf.abs(_signed32(field["bmp_height"])), tf.abs(_signed32(field["bmp_width"]))))
    lossy = _size(tf.bitwise.bitwise_and(field["lossy_height"], 0x3FFF),
                  tf.bitwise.bitwise_and(field["lossy_width"], 0x3FFF))
    bits = field["lossless_bits"]
    lossless = _size(tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 14), 0x3FFF) + 1,
                     tf.bitwise.bitwise_and(bits, 0x3FFF) + 1)
    animated = tf.logical_and(
        found["webp_extended"], tf.bitwise.bitwise_and(field["extended_flags"], WEBP_ANIMATION_FLAG) != 0)
    extended = _size(field["extended_height"] + 1, field["extended_width"] + 1, _webp_frames(data, animated))
    webp = tf.where(found["webp_lossy"], tf.where(found["lossy_start_code"], lossy, zero),
                    tf.where(found["webp_lossless"], tf.where(found["lossless_signature"], lossless, zero),
                             tf.where(found["webp_extended"], extended, zero)))
    return tf.stack([zero, zero, png, gif, bmp, webp])


def _signed32(value):
    return tf.where(value >= 2**31, value - 2**32, value)


def image_header(data):
    """(format, [height, width, frames]) declared by the encoded image `data` (a scalar string tensor).

    format is one of UNKNOWN, JPEG, PNG, GIF, BMP, WEBP; sizes are int64 and 0 when
    the header cannot be read. frames counts what the decoder would allocate
    (WebP animations decode every frame). A JPEG whose markers are corrupt raises
    InvalidArgumentError, like a failed decode.
    """
    data = tf.convert_to_tensor(data, tf.string)
    head = head_bytes(data)
    image_format = sniff_format(head)
    # Fixed-offset fields are computed for every format and selected: cheaper than a branch
    # per format, because every branch is a function instantiated again by each new dataset.
    fixed = _fixed_offset_sizes(data, head)

    def jpeg_size():
        # libjpeg reads the markers up to the frame header; no pixel is decoded.
        shape = tf.image.extract_jpeg_shape(data, output_type=tf.int64)
        return _size(shape[0], shape[1])

    is_jpeg = tf.equal(image_format, JPEG)
    jpeg = tf.cond(is_jpeg, jpeg_size, lambda: _size(0, 0))
    size = tf.where(is_jpeg, jpeg, tf.gather(fixed, image_format))
    return image_format, size


def declared_pixels(size):
    return size[0] * size[1] * size[2]
