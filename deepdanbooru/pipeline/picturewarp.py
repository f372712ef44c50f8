"""The warp of packed pictures: OpenCV's vectorised bilinear warpAffine, one picture at a time inside tf.data.

A shard holds each picture already fitted to the training box, so decoding it is cheap and the warp was the
largest part of its CPU time: the compiled XLA kernel (transform.py) gathers every output value with scalar
code, 1.8 CPU-ms a 448x448 picture on this project's CPUs, where warpAffine takes about 0.6. The maps and
conventions are the XLA kernel's (pixel centres at integer coordinates, border pixels repeated outward or white
outside), but OpenCV places each sample to 1/32 of a pixel and rounds the result to whole levels, so a warped
picture differs from the XLA kernel's by about a third of a level on average. Original files keep the XLA warp
bit for bit.
"""

from __future__ import annotations

import functools

import cv2
import numpy as np
import tensorflow as tf

from deepdanbooru.pipeline.fill import WHITE
from deepdanbooru.pipeline.transform import drawn_parameters

# tf.data already warps one picture per core; OpenCV's own threads would only compete with it.
cv2.setNumThreads(1)

_FLAGS = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP


def warp_array(picture: np.ndarray, parameters, output_size, white: bool = False) -> np.ndarray:
    """uint8 [h, w, 3] -> uint8 [height, width, 3]: output (x, y) samples (a x + b y + e, c x + d y + f)."""
    a, b, c, d, e, f = np.asarray(parameters, np.float64)
    matrix = np.array([[a, b, e], [c, d, f]])
    height, width = output_size
    if white:
        return cv2.warpAffine(picture, matrix, (width, height), flags=_FLAGS, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=(WHITE, WHITE, WHITE))
    return cv2.warpAffine(picture, matrix, (width, height), flags=_FLAGS, borderMode=cv2.BORDER_REPLICATE)


def decode_and_warp_array(data: bytes, parameters, output_size, white: bool = False) -> np.ndarray:
    """JPEG bytes -> uint8 [height, width, 3]: decoded as decode_jpeg(dct_method="INTEGER_ACCURATE") does, warped."""
    if isinstance(data, np.ndarray):  # a scalar string tensor arrives so when run eagerly
        data = data.item()
    picture = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    if picture is None:
        raise ValueError("the packed picture cannot be decoded")
    return warp_array(picture, parameters, output_size, white)


def packed_picture(data, box, uniforms, output_size, augmentation, white: bool = False):
    """In the graph: a packed picture's JPEG bytes -> uint8 [height, width, 3], warped as `uniforms` draw.

    Packed pictures already fit `box` (pack fitted them into it, rounded down), so the warp's zoom is the
    one fit_into_box gives a picture that fits, and its size is read from the JPEG header before decoding.
    """
    size = tf.io.extract_jpeg_shape(data)[:2]
    source = tf.cast(size, tf.float32)
    zoom = tf.minimum(box[0] / source[0], box[1] / source[1])
    parameters = drawn_parameters(size, zoom, uniforms, output_size, augmentation)
    warp = functools.partial(decode_and_warp_array, output_size=tuple(output_size), white=white)
    warped = tf.numpy_function(warp, [data, parameters], tf.uint8, stateful=False)
    return tf.ensure_shape(warped, [*output_size, 3])
