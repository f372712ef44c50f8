"""The warp of packed pictures: OpenCV's decoder and vectorised bilinear warpAffine, a batch at a time.

A shard holds each picture already fitted to the training box, so decoding it is cheap and the warp was the
largest part of its CPU time: the compiled XLA kernel (transform.py) gathers every output value with scalar
code, 1.6-1.9 CPU-ms a 448x448 picture on this project's CPUs, where warpAffine takes about 0.6. The maps and
conventions are the XLA kernel's (pixel centres at integer coordinates, border pixels repeated outward or white
outside), but OpenCV places each sample to 1/32 of a pixel and rounds the result to whole levels, so a warped
picture differs from the XLA kernel's by a fraction of a level on average. Original files keep the XLA warp
bit for bit.

Per record the graph only reads the JPEG's size from its header; per batch the maps are computed with batched
ops and one numpy_function decodes and warps every picture straight into the batch: computing the maps and
warping per record cost 15-18% more CPU a packed picture in a side-by-side prototype (docs/performance.md).
"""

from __future__ import annotations

import functools

import cv2
import numpy as np
import tensorflow as tf

from deepdanbooru.pipeline.fill import WHITE
from deepdanbooru.pipeline.transform import drawn_parameters

# tf.data already runs one batch per core; OpenCV's own threads would only compete with it.
cv2.setNumThreads(1)

_FLAGS = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP


def warp_array(picture: np.ndarray, parameters, output_size, white: bool = False, out=None) -> np.ndarray:
    """uint8 [h, w, 3] -> uint8 [height, width, 3]: output (x, y) samples (a x + b y + e, c x + d y + f)."""
    a, b, c, d, e, f = np.asarray(parameters, np.float64)
    matrix = np.array([[a, b, e], [c, d, f]])
    height, width = output_size
    if white:
        return cv2.warpAffine(picture, matrix, (width, height), dst=out, flags=_FLAGS,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(WHITE, WHITE, WHITE))
    return cv2.warpAffine(picture, matrix, (width, height), dst=out, flags=_FLAGS, borderMode=cv2.BORDER_REPLICATE)


def decode_array(data: bytes) -> np.ndarray | None:
    """JPEG bytes -> uint8 [h, w, 3] as decode_jpeg(dct_method="INTEGER_ACCURATE") decodes them; None when it
    cannot."""
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)


def decode_and_warp_batch(datas, parameters, output_size, white: bool = False):
    """JPEG bytes [b] and maps [b, 6] -> (uint8 [b, height, width, 3], bool [b]: decoded).

    A picture OpenCV cannot decode is left black and marked False, so the batch step can leave it out.
    """
    pictures = np.zeros((len(datas), *output_size, 3), np.uint8)
    decoded = np.ones(len(datas), bool)
    for n, data in enumerate(datas):
        picture = decode_array(data)
        if picture is None:
            decoded[n] = False
        else:
            warp_array(picture, parameters[n], output_size, white, out=pictures[n])
    return pictures, decoded


def packed_size(data, box):
    """In the graph, per record: (size int32 [2], zoom) of a packed picture, from its JPEG header.

    Packed pictures already fit `box` (pack fitted them into it, rounded down), so the zoom is the one
    fit_into_box gives a picture that fits.
    """
    size = tf.io.extract_jpeg_shape(data)[:2]
    source = tf.cast(size, tf.float32)
    return size, tf.minimum(box[0] / source[0], box[1] / source[1])


def warp_packed_batch(datas, sizes, zooms, uniforms, output_size, augmentation, white: bool = False):
    """In the graph, per batch: (uint8 [b, height, width, 3] warped as `uniforms` draw, bool [b]: decoded)."""
    parameters = drawn_parameters(sizes, zooms, uniforms, output_size, augmentation)
    warp = functools.partial(decode_and_warp_batch, output_size=tuple(output_size), white=white)
    pictures, decoded = tf.numpy_function(warp, [datas, parameters], [tf.uint8, tf.bool], stateful=False)
    return tf.ensure_shape(pictures, [None, *output_size, 3]), tf.ensure_shape(decoded, [None])
