"""Image format and declared size, read in-graph from the first bytes before anything is decoded.

The format comes from the file signature, never from the extension. The size is
what the header declares, so an oversized image (a decompression bomb) can be
refused before a decoder allocates its pixels.

Every op here runs once per record, and a dataset built per slice instantiates
every op again, so the parsing is table-driven and branches per format.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from deepdanbooru.formats import IMAGE_FORMATS

# Format indices in the graph: 0 for unknown, then deepdanbooru.formats' table order.
FORMAT_NAMES = ("unknown", *(image_format.name for image_format in IMAGE_FORMATS))
UNKNOWN = 0
JPEG, PNG, GIF, BMP, WEBP = (FORMAT_NAMES.index(name) for name in ("jpeg", "png", "gif", "bmp", "webp"))

HEAD_BYTES = 32
# VP8X flag bits (byte 20 of a WebP file).
WEBP_ANIMATION_FLAG = 0x02
WEBP_ALPHA_FLAG = 0x10

# (format, offset, bytes): a file is of the first format whose signatures all match.
_FORMAT_SIGNATURES = (
    (JPEG, 0, b"\xff\xd8\xff"),
    (PNG, 0, b"\x89PNG\r\n\x1a\n"),
    (GIF, 0, b"GIF8"),
    (BMP, 0, b"BM"),
    (WEBP, 0, b"RIFF"),
    (WEBP, 8, b"WEBP"),
)
# WebP sub-formats, tested inside the WebP branch.
_WEBP_CHUNKS = ((12, b"VP8 "), (12, b"VP8L"), (12, b"VP8X"), (23, b"\x9d\x01\x2a"), (20, b"\x2f"))


def _pattern(signatures):
    """Rows of (pattern, mask) over the head bytes, one per (offset, bytes) signature."""
    pattern = np.zeros((len(signatures), HEAD_BYTES), np.int64)
    mask = np.zeros((len(signatures), HEAD_BYTES), bool)
    for row, (offset, signature) in enumerate(signatures):
        pattern[row, offset:offset + len(signature)] = list(signature)
        mask[row, offset:offset + len(signature)] = True
    return pattern, ~mask


_FORMAT_PATTERN, _FORMAT_IGNORED = _pattern([(offset, sig) for _, offset, sig in _FORMAT_SIGNATURES])
_FORMAT_OF_ROW = np.array([fmt for fmt, _, _ in _FORMAT_SIGNATURES], np.int64)
_WEBP_PATTERN, _WEBP_IGNORED = _pattern(_WEBP_CHUNKS)


def head_bytes(data):
    """The first HEAD_BYTES bytes of `data` as int64, zero-padded."""
    raw = tf.io.decode_raw(tf.strings.substr(data, 0, HEAD_BYTES), tf.uint8)
    return tf.cast(tf.pad(raw, [[0, HEAD_BYTES - tf.size(raw)]]), tf.int64)


def _matches(head, pattern, ignored):
    return tf.reduce_all(tf.logical_or(tf.equal(head[None, :], pattern), ignored), axis=1)


def sniff_format(head):
    """UNKNOWN, JPEG, PNG, GIF, BMP or WEBP from the signature bytes."""
    matched = _matches(head, _FORMAT_PATTERN, _FORMAT_IGNORED)
    # A format counts when all its rows match: sum matches per format and compare with its row count.
    hits = tf.math.unsorted_segment_sum(tf.cast(matched, tf.int64), _FORMAT_OF_ROW, len(FORMAT_NAMES))
    needed = np.bincount(_FORMAT_OF_ROW, minlength=len(FORMAT_NAMES))
    needed[UNKNOWN] = 1  # never "all matched"
    complete = tf.cast(tf.equal(hits, needed), tf.int64)
    return tf.reduce_sum(complete * np.arange(len(FORMAT_NAMES)))


def read_fields(head, fields):
    """Unsigned integers at fixed offsets: fields = ((offset, byte count, big endian), ...) -> int64 [n]."""
    index = np.zeros((len(fields), 4), np.int64)
    shift = np.zeros((len(fields), 4), np.int64)
    used = np.zeros((len(fields), 4), np.int64)
    for row, (offset, size, big_endian) in enumerate(fields):
        for i in range(size):
            index[row, i] = offset + i
            shift[row, i] = 8 * (size - 1 - i if big_endian else i)
            used[row, i] = 1
    return tf.reduce_sum(tf.bitwise.left_shift(tf.gather(head, index), shift) * used, axis=1)


def is_animated_webp(head):
    """VP8X chunk with the animation flag (only meaningful once the format is known to be WebP)."""
    chunk = _matches(head, _WEBP_PATTERN[2:3], _WEBP_IGNORED[2:3])[0]
    return tf.logical_and(chunk, tf.bitwise.bitwise_and(head[20], WEBP_ANIMATION_FLAG) != 0)


def _size(height, width, frames=1):
    return tf.stack([tf.cast(height, tf.int64), tf.cast(width, tf.int64), tf.cast(frames, tf.int64)])


def _jpeg(data, head):
    # libjpeg reads the markers up to the frame header; no pixel is decoded.
    shape = tf.image.extract_jpeg_shape(data, output_type=tf.int64)
    return tf.concat([shape[:2], [1]], axis=0)


def _png(data, head):
    width, height = tf.unstack(read_fields(head, ((16, 4, True), (20, 4, True))))
    has_ihdr = tf.reduce_all(tf.equal(head[12:16], list(b"IHDR")))
    return tf.where(has_ihdr, _size(height, width), _size(0, 0))


# Block walk over a GIF: each loop step reads one block header or skips up to _GIF_HOPS data
# sub-blocks, and advances at least one byte; the cap bounds the work on crafted files.
GIF_MAX_STEPS = 1 << 14
_GIF_HOPS = 4
_GIF_EXTENSION, _GIF_IMAGE = 0x21, 0x2C
_GIF_DESCRIPTOR = ((0, 1, False), (1, 2, False), (3, 2, False), (5, 2, False), (7, 2, False), (9, 1, False))


def _colour_table_bytes(flags):
    return tf.where(tf.bitwise.bitwise_and(flags, 0x80) != 0,
                    3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), tf.bitwise.bitwise_and(flags, 7)), 0)


def _gif(data, head):
    """[canvas height, canvas width, frames]: TensorFlow's canvas spans every frame, not just the screen.

    giflib reads every frame's raster before TensorFlow keeps the first, and a
    frame may be larger than the logical screen, so the frame descriptors
    (behind variable-length blocks) are walked in-graph. A walk stopped by
    GIF_MAX_STEPS before the trailer declares size 0, and the file is refused.
    """
    screen_w, screen_h, flags = tf.unstack(read_fields(head, ((6, 2, False), (8, 2, False), (10, 1, False))))
    body = tf.io.decode_raw(data, tf.uint8)
    length = tf.size(body, out_type=tf.int64)
    body = tf.concat([body, tf.zeros([16], tf.uint8)], axis=0)  # reads past the end see zeros

    def read(positions):
        return tf.cast(tf.gather(body, tf.minimum(positions, length)), tf.int64)

    def step(position, in_blocks, height, width, frames, finished, steps):
        # Inside a run of data sub-blocks: a size byte, then that many bytes; size 0 ends the run.
        hop_position, hopping = position, in_blocks
        for _ in range(_GIF_HOPS):
            size = read(hop_position)
            hop_position = tf.where(hopping, hop_position + 1 + size, hop_position)
            hopping = tf.logical_and(hopping, tf.logical_and(size != 0, hop_position < length))
        kind, left, top, frame_w, frame_h, frame_flags = tf.unstack(
            read_fields(read(position + tf.range(10, dtype=tf.int64)), _GIF_DESCRIPTOR))
        is_image = tf.logical_and(tf.logical_not(in_blocks), tf.equal(kind, _GIF_IMAGE))
        is_extension = tf.logical_and(tf.logical_not(in_blocks), tf.equal(kind, _GIF_EXTENSION))
        # Image: 10-byte descriptor, local colour table, LZW code size byte, then sub-blocks.
        block_position = tf.where(is_image, position + 11 + _colour_table_bytes(frame_flags), position + 2)
        ended = tf.logical_and(tf.logical_not(in_blocks), tf.logical_not(tf.logical_or(is_image, is_extension)))
        return (tf.where(in_blocks, hop_position, block_position),
                tf.where(in_blocks, hopping, tf.logical_or(is_image, is_extension)),
                tf.where(is_image, tf.maximum(height, top + frame_h), height),
                tf.where(is_image, tf.maximum(width, left + frame_w), width),
                frames + tf.cast(is_image, tf.int64), ended, steps + 1)

    def running(position, in_blocks, height, width, frames, finished, steps):
        return tf.logical_and(tf.logical_not(finished), tf.logical_and(position < length, steps < GIF_MAX_STEPS))

    start = (13 + _colour_table_bytes(flags), tf.constant(False), screen_h, screen_w, tf.constant(0, tf.int64),
             tf.constant(False), tf.constant(0, tf.int64))
    position, _, height, width, frames, finished, _ = tf.while_loop(running, step, start)
    # A walk that ran out of data (a truncated file) bounds all there is; one stopped by the cap does not.
    trusted = tf.logical_or(finished, position >= length)
    return tf.where(trusted, _size(height, width, tf.maximum(frames, 1)), _size(0, 0))


def _bmp(data, head):
    header, core_w, core_h, width, height = tf.unstack(read_fields(
        head, ((14, 4, False), (18, 2, False), (20, 2, False), (18, 4, False), (22, 4, False))))
    # BITMAPCOREHEADER (12 bytes) has 16-bit sizes; the others signed 32-bit (negative height: top-down).
    signed = tf.where(tf.stack([width, height]) >= 2**31, tf.stack([width, height]) - 2**32,
                      tf.stack([width, height]))
    return tf.where(tf.equal(header, 12), _size(core_h, core_w), _size(tf.abs(signed[1]), tf.abs(signed[0])))


def _webp(data, head):
    lossy, lossless, extended, start_code, signature = tf.unstack(_matches(head, _WEBP_PATTERN, _WEBP_IGNORED))
    lossy_w, lossy_h, bits, canvas_w, canvas_h = tf.unstack(read_fields(
        head, ((26, 2, False), (28, 2, False), (21, 4, False), (24, 3, False), (27, 3, False))))

    def frames():
        # Every ANMF chunk is one frame and TensorFlow decodes them all; the tag may also occur
        # inside compressed data, which only overestimates, so the guard errs on the safe side.
        return tf.maximum(tf.cast(tf.size(tf.strings.split(data, "ANMF")), tf.int64) - 1, 1)

    count = tf.cond(is_animated_webp(head), frames, lambda: tf.constant(1, tf.int64))
    sizes = tf.stack([
        _size(0, 0),
        _size(tf.bitwise.bitwise_and(lossy_h, 0x3FFF), tf.bitwise.bitwise_and(lossy_w, 0x3FFF)),
        _size(tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 14), 0x3FFF) + 1,
              tf.bitwise.bitwise_and(bits, 0x3FFF) + 1),
        _size(canvas_h + 1, canvas_w + 1, count),
    ])
    kind = tf.where(extended, 3, tf.where(tf.logical_and(lossless, signature), 2,
                                          tf.where(tf.logical_and(lossy, start_code), 1, 0)))
    return tf.gather(sizes, kind)


def image_header(data):
    """(format, int64 [height, width, frames]) declared by the encoded image `data` (a scalar string tensor).

    format is one of UNKNOWN, JPEG, PNG, GIF, BMP, WEBP (names in FORMAT_NAMES);
    sizes are 0 when the header cannot be read. frames counts what the decoder
    would allocate (WebP animations decode every frame). A JPEG whose markers
    are corrupt raises InvalidArgumentError, like a failed decode.
    """
    image_format, size, _ = parse_header(tf.convert_to_tensor(data, tf.string))
    return image_format, size


def parse_header(data):
    """(format, size, head bytes): image_header plus the bytes, for the decoder to reuse."""
    head = head_bytes(data)
    image_format = sniff_format(head)
    parsers = {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp, "webp": _webp}
    branches = [lambda: _size(0, 0)] + [
        (lambda parse: lambda: parse(data, head))(parsers[name]) for name in FORMAT_NAMES[1:]]
    return image_format, tf.switch_case(tf.cast(image_format, tf.int32), branches), head


def declared_pixels(size):
    return tf.reduce_prod(size)
