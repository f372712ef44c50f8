"""Geometry shared by training and inference: fit onto a fixed canvas, then one affine warp per image.

Per record (inside the parallel map) the image is area-resized to fit the box
and padded onto a fixed-size canvas; per batch a compiled gather-based warp
samples every output pixel bilinearly with coordinates clamped to the image,
which is the same as replicating border pixels. Training draws the warp from
stateless random numbers keyed by (seed, random_seed, position); inference uses
the identity warp, so both go through the same code.

Conventions: pixel (x, y) has its centre at integer coordinates; the centre of
an n-pixel axis is pixel floor(n / 2), so an identity warp copies pixels exactly
(no half-pixel blur) and rotations of an odd-sized image by multiples of 90
degrees are exact. A positive angle turns the picture counter-clockwise as
displayed; a positive shift moves it right / down.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tensorflow as tf

RANDOM_ALGORITHM = "philox"  # pinned: "auto_select" may pick another generator on another device


@dataclass(frozen=True)
class Augmentation:
    """Ranges as in project.json: (low, high) or None when disabled."""

    rotation_range: tuple[float, float] | None = None
    scale_range: tuple[float, float] | None = None
    shift_range: tuple[float, float] | None = None

    def __post_init__(self):
        for name in ("rotation_range", "scale_range", "shift_range"):
            value = getattr(self, name)
            # [] disables like null does (SPEC section 2).
            object.__setattr__(self, name, tuple(float(v) for v in value) if value else None)

    @property
    def scale_max(self) -> float:
        return self.scale_range[1] if self.scale_range else 1.0


def canvas_size(height: int, width: int, scale_max: float = 1.0) -> tuple[int, int]:
    """The fixed per-record canvas: the box images are fitted into, rounded up."""
    # The small epsilon keeps 299 * 1.1 = 328.90000000000003 from becoming 330.
    return (max(1, math.ceil(height * scale_max - 1e-6)), max(1, math.ceil(width * scale_max - 1e-6)))


def fit_into_box(image, source_size, box, canvas):
    """Area-resize `image` to fit `box` (height, width floats) keeping aspect; never larger than `canvas`.

    `source_size` is the full-resolution size (the image may come DCT-scaled).
    Returns (content uint8 [h', w', 3], content size int32 [2], zoom float32):
    images smaller than the box are not enlarged here; the warp enlarges them
    bilinearly by `zoom` (area "enlargement" would only replicate pixels).
    """
    source = tf.cast(source_size, tf.float32)
    factor = tf.minimum(box[0] / source[0], box[1] / source[1])

    def shrink():
        target = tf.cast(tf.round(source * factor), tf.int32)
        target = tf.clip_by_value(target, 1, tf.constant(canvas, tf.int32))
        resized = tf.image.resize(image, target, method="area")
        return tf.cast(tf.round(resized), tf.uint8)

    enlarge = factor >= 1.0
    content = tf.cond(enlarge, lambda: image, shrink)
    zoom = tf.where(enlarge, factor, 1.0)
    return content, tf.shape(content)[:2], zoom


def place_on_canvas(content, canvas):
    """Pad to the fixed canvas (top-left aligned): the warp clamps to the content, so the fill is never seen."""
    size = tf.shape(content)[:2]
    placed = tf.pad(content, [[0, canvas[0] - size[0]], [0, canvas[1] - size[1]], [0, 0]])
    return tf.ensure_shape(placed, [canvas[0], canvas[1], 3])


def warp_parameters(content_size, zoom, output_size, scale=1.0, angle_degrees=0.0, shift=(0.0, 0.0)):
    """Inverse affine map [a, b, c, d, e, f]: output (x, y) samples input (a x + b y + e, c x + d y + f).

    Forward: move the content centre to the origin, scale by zoom * scale,
    rotate by angle_degrees, move to the output centre, shift by
    (width * shift[0], height * shift[1]).
    """
    out_h, out_w = output_size
    centre_in = tf.cast(tf.math.floordiv(content_size, 2), tf.float32)  # (y, x)
    centre_out_x = float(out_w // 2) + out_w * tf.cast(shift[0], tf.float32)
    centre_out_y = float(out_h // 2) + out_h * tf.cast(shift[1], tf.float32)
    angle = tf.cast(angle_degrees, tf.float32) * (math.pi / 180.0)
    inverse_scale = 1.0 / (tf.cast(zoom, tf.float32) * tf.cast(scale, tf.float32))
    cos = tf.cos(angle) * inverse_scale
    sin = tf.sin(angle) * inverse_scale
    offset_x = centre_in[1] - (cos * centre_out_x - sin * centre_out_y)
    offset_y = centre_in[0] - (sin * centre_out_x + cos * centre_out_y)
    return tf.stack([cos, -sin, sin, cos, offset_x, offset_y])


def record_key(seed, random_seed, position):
    """The stateless random key of one record: a pure function of (seed, random_seed, position)."""
    base = tf.stack([tf.cast(seed, tf.int64), tf.cast(random_seed, tf.int64)])
    return tf.random.experimental.stateless_fold_in(base, tf.cast(position, tf.int64), alg=RANDOM_ALGORITHM)


def random_warp(key, augmentation: Augmentation):
    """(scale relative to scale_max, angle in degrees, (dx, dy)) drawn uniformly from the ranges."""
    uniform = tf.random.stateless_uniform([4], seed=key, alg=RANDOM_ALGORITHM)

    def draw(value_range, u, disabled):
        if value_range is None:
            return tf.constant(disabled, tf.float32)
        low, high = value_range
        return low + (high - low) * u

    scale = draw(augmentation.scale_range, uniform[0], 1.0) / augmentation.scale_max
    angle = draw(augmentation.rotation_range, uniform[1], 0.0)
    shift = (draw(augmentation.shift_range, uniform[2], 0.0), draw(augmentation.shift_range, uniform[3], 0.0))
    return scale, angle, shift


def _warp(canvas, parameters, content_size, output_size):
    batch, canvas_h, canvas_w = tf.shape(canvas)[0], tf.shape(canvas)[1], tf.shape(canvas)[2]
    out_h, out_w = output_size
    p = parameters[:, :, None, None]
    ys = tf.range(out_h, dtype=tf.float32)[None, :, None]
    xs = tf.range(out_w, dtype=tf.float32)[None, None, :]
    src_x = p[:, 0] * xs + p[:, 1] * ys + p[:, 4]
    src_y = p[:, 2] * xs + p[:, 3] * ys + p[:, 5]
    last_y = (content_size[:, 0] - 1)[:, None, None]
    last_x = (content_size[:, 1] - 1)[:, None, None]
    # Clamping the sample position to the image is border replication, also for bilinear weights.
    src_x = tf.clip_by_value(src_x, 0.0, tf.cast(last_x, tf.float32))
    src_y = tf.clip_by_value(src_y, 0.0, tf.cast(last_y, tf.float32))
    x0f, y0f = tf.floor(src_x), tf.floor(src_y)
    fx, fy = (src_x - x0f)[..., None], (src_y - y0f)[..., None]
    x0, y0 = tf.cast(x0f, tf.int32), tf.cast(y0f, tf.int32)
    x1, y1 = tf.minimum(x0 + 1, last_x), tf.minimum(y0 + 1, last_y)
    pixels = tf.reshape(canvas, [-1, 3])
    base = (tf.range(batch) * canvas_h * canvas_w)[:, None, None]

    def at(y, x):
        return tf.cast(tf.gather(pixels, base + y * canvas_w + x), tf.float32)

    top_left, top_right = at(y0, x0), at(y0, x1)
    bottom_left, bottom_right = at(y1, x0), at(y1, x1)
    top = top_left + (top_right - top_left) * fx
    bottom = bottom_left + (bottom_right - bottom_left) * fx
    return (top + (bottom - top) * fy) * (1.0 / 255.0)


@functools.lru_cache(maxsize=None)
def _compiled_warp(output_size):
    # Per-image ImageProjectiveTransform evaluates the whole projection for every channel of every
    # pixel; one fused XLA loop over the batch is about five times cheaper on a CPU.
    return tf.function(lambda c, p, s: _warp(c, p, s, output_size), jit_compile=True, reduce_retracing=True)


def warp_batch(canvas, parameters, content_size, output_size, batch_size):
    """Warp a batch of canvases (uint8 [b, H', W', 3]) to float32 [b, height, width, 3] in [0, 1].

    The batch is padded to `batch_size` so the compiled kernel sees one shape
    whatever the number of images that survived decoding.
    """
    count = tf.shape(canvas)[0]
    missing = batch_size - count
    canvas = tf.pad(canvas, [[0, missing], [0, 0], [0, 0], [0, 0]])
    parameters = tf.pad(parameters, [[0, missing], [0, 0]])
    content_size = tf.pad(content_size, [[0, missing], [0, 0]], constant_values=1)
    images = _compiled_warp(tuple(output_size))(canvas, parameters, content_size)
    return images[:count]
