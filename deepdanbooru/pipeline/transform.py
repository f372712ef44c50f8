"""Geometry shared by training and inference: fit onto a fixed canvas, then one affine warp per image.

Per record (inside the parallel map) the image is area-resized to fit the box
and padded onto a fixed-size canvas; per batch a compiled gather-based warp
samples every output pixel bilinearly with coordinates clamped to the image,
which is the same as replicating border pixels (or, with a white Fill, with
every pixel outside the image white: the image padded with white). Training draws the warp from
stateless random numbers keyed by (seed, random_seed, position); inference uses
the identity warp, so both go through the same code. A random resized crop and
a horizontal flip, when enabled, are folded into the same warp.

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

from deepdanbooru.pipeline.fill import WHITE, Fill

RANDOM_ALGORITHM = "philox"  # pinned: "auto_select" may pick another generator on another device
BASE_UNIFORMS = 4
EXTENDED_UNIFORMS = 8
# XORed into the record key for draws added after DeepDanbooru's four, so those four stay what they were.
EXTRA_STREAM = 0x5DEECE66D


@dataclass(frozen=True)
class Augmentation:
    """Ranges as in project.json: (low, high) or None when disabled."""

    rotation_range: tuple[float, float] | None = None
    scale_range: tuple[float, float] | None = None
    shift_range: tuple[float, float] | None = None
    horizontal_flip: bool = False
    crop_area_range: tuple[float, float] | None = None  # area fraction of the fitted image, 0 < lo <= hi <= 1

    def __post_init__(self):
        for name in ("rotation_range", "scale_range", "shift_range", "crop_area_range"):
            value = getattr(self, name)
            # [] disables like null does, as in DeepDanbooru's project.json.
            object.__setattr__(self, name, tuple(float(v) for v in value) if value else None)
        object.__setattr__(self, "horizontal_flip", bool(self.horizontal_flip))

    @property
    def scale_max(self) -> float:
        return self.scale_range[1] if self.scale_range else 1.0

    @property
    def box_factor(self) -> float:
        """Images are fitted into the output size times this, so the largest zoom still samples real pixels."""
        if self.crop_area_range is None:
            return self.scale_max
        return self.scale_max / math.sqrt(self.crop_area_range[0])

    @property
    def uniform_count(self) -> int:
        """Uniforms per record: DeepDanbooru's four (scale, angle, dx, dy), then flip, crop area, crop x, crop y."""
        return EXTENDED_UNIFORMS if self.horizontal_flip or self.crop_area_range else BASE_UNIFORMS


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


def warp_parameters(content_size, zoom, output_size, scale=1.0, angle_degrees=0.0, shift=(0.0, 0.0), crop=None):
    """Inverse affine maps [..., 6] = (a, b, c, d, e, f): output (x, y) samples input (a x + b y + e, c x + d y + f).

    Forward: move the content centre to the origin, scale by zoom * scale,
    rotate by angle_degrees, move to the output centre, shift by
    (width * shift[0], height * shift[1]). content_size is int [..., 2]
    (height, width); the other arguments broadcast against its leading shape.
    crop (side, (x, y)): the part of the content `side` times its width and
    height, centred `x` content widths right of and `y` heights below the
    content centre, fills the place the whole content would have filled.
    """
    out_h, out_w = output_size
    centre_y, centre_x = tf.unstack(tf.cast(tf.math.floordiv(content_size, 2), tf.float32), axis=-1)
    centre_out_x = float(out_w // 2) + out_w * tf.cast(shift[0], tf.float32)
    centre_out_y = float(out_h // 2) + out_h * tf.cast(shift[1], tf.float32)
    angle = tf.cast(angle_degrees, tf.float32) * (math.pi / 180.0)
    inverse_scale = 1.0 / (tf.cast(zoom, tf.float32) * tf.cast(scale, tf.float32))
    if crop is not None:
        # A Python branch, not a multiplication by 1: without a crop the arithmetic stays DeepDanbooru's.
        side, (crop_x, crop_y) = crop
        content_h, content_w = tf.unstack(tf.cast(content_size, tf.float32), axis=-1)
        centre_x = centre_x + crop_x * content_w
        centre_y = centre_y + crop_y * content_h
        inverse_scale = inverse_scale * side
    cos = tf.cos(angle) * inverse_scale
    sin = tf.sin(angle) * inverse_scale
    offset_x = centre_x - (cos * centre_out_x - sin * centre_out_y)
    offset_y = centre_y - (sin * centre_out_x + cos * centre_out_y)
    cos, sin, offset_x, offset_y = (tf.broadcast_to(v, tf.shape(centre_x)) for v in (cos, sin, offset_x, offset_y))
    return tf.stack([cos, -sin, sin, cos, offset_x, offset_y], axis=-1)


def seed_hash(seed, random_seed):
    """One int64 from (seed, random_seed): the first half of every record's random key."""
    pair = tf.stack([tf.cast(seed, tf.int64), tf.cast(random_seed, tf.int64)])
    return tf.random.stateless_uniform([], seed=pair, minval=None, maxval=None, dtype=tf.int64,
                                       alg=RANDOM_ALGORITHM)


def record_key(hashed_seed, position, stream: int = 0):
    """The stateless key of one record's draws; another `stream` gives independent numbers."""
    hashed = tf.cast(hashed_seed, tf.int64)
    if stream:
        hashed = tf.bitwise.bitwise_xor(hashed, tf.constant(stream, tf.int64))
    return tf.stack([hashed, tf.cast(position, tf.int64)])


def record_uniforms(hashed_seed, position, count: int = BASE_UNIFORMS):
    """`count` uniforms in [0, 1): a pure function of (seed, random_seed, position), whatever the process.

    The first four are DeepDanbooru's whatever `count` is.
    """
    uniforms = tf.random.stateless_uniform([BASE_UNIFORMS], seed=record_key(hashed_seed, position),
                                           alg=RANDOM_ALGORITHM)
    if count == BASE_UNIFORMS:
        return uniforms
    extra = tf.random.stateless_uniform([count - BASE_UNIFORMS], seed=record_key(hashed_seed, position, EXTRA_STREAM),
                                        alg=RANDOM_ALGORITHM)
    return tf.concat([uniforms, extra], axis=0)


def augmentation_values(uniforms, augmentation: Augmentation):
    """uniforms [..., 4 or more] -> (scale relative to box_factor, angle in degrees, (dx, dy)), each [...]."""
    u_scale, u_angle, u_dx, u_dy = tf.unstack(uniforms[..., :BASE_UNIFORMS], axis=-1)
    scale = _draw(augmentation.scale_range, u_scale, 1.0) / augmentation.box_factor
    angle = _draw(augmentation.rotation_range, u_angle, 0.0)
    return scale, angle, (_draw(augmentation.shift_range, u_dx, 0.0), _draw(augmentation.shift_range, u_dy, 0.0))


def extra_values(uniforms, augmentation: Augmentation):
    """uniforms [..., 8] -> (flip bool [...] or None, crop (side, (x, y)) or None) for warp_parameters."""
    if augmentation.uniform_count == BASE_UNIFORMS:
        return None, None
    u_flip, u_area, u_x, u_y = tf.unstack(uniforms[..., BASE_UNIFORMS:], axis=-1)
    flip = u_flip < 0.5 if augmentation.horizontal_flip else None
    crop = None
    if augmentation.crop_area_range is not None:
        side = tf.sqrt(_draw(augmentation.crop_area_range, u_area, 1.0))
        # Anywhere inside the content: the centre moves at most half the part left over on each axis.
        room = 1.0 - side
        crop = (side, ((u_x - 0.5) * room, (u_y - 0.5) * room))
    return flip, crop


def _draw(value_range, u, disabled):
    if value_range is None:
        return tf.fill(tf.shape(u), disabled)
    low, high = value_range
    return low + (high - low) * u


def drawn_parameters(content_size, zoom, uniforms, output_size, augmentation: Augmentation | None):
    """The inverse maps [..., 6] the uniforms [..., n] draw (the identity warp when augmentation is None)."""
    if augmentation is None:
        return warp_parameters(content_size, zoom, output_size)
    scale, angle, shift = augmentation_values(uniforms, augmentation)
    flip, crop = extra_values(uniforms, augmentation)
    parameters = warp_parameters(content_size, zoom, output_size, scale, angle, shift, crop)
    if flip is not None:
        parameters = flip_horizontally(parameters, flip, output_size[1])
    return parameters


def flip_horizontally(parameters, flip, output_width: int):
    """Where `flip`, the maps mirrored so output column x shows what column width-1-x would have: an exact flip."""
    a, b, c, d, e, f = tf.unstack(parameters, axis=-1)
    last = float(output_width - 1)
    mirrored = tf.stack([-a, b, -c, d, a * last + e, c * last + f], axis=-1)
    return tf.where(flip[..., None], mirrored, parameters)


def _warp(canvas, parameters, content_size, output_size, white=False):
    out_h, out_w = output_size
    p = parameters[:, :, None, None]
    ys = tf.range(out_h, dtype=tf.float32)[None, :, None]
    xs = tf.range(out_w, dtype=tf.float32)[None, None, :]
    src_x = p[:, 0] * xs + p[:, 1] * ys + p[:, 4]
    src_y = p[:, 2] * xs + p[:, 3] * ys + p[:, 5]
    last_y = (content_size[:, 0] - 1)[:, None, None]
    last_x = (content_size[:, 1] - 1)[:, None, None]
    if white:
        return _sample_on_white(canvas, src_x, src_y, last_x, last_y)
    # Clamping the sample position to the image is border replication, also for bilinear weights.
    src_x = tf.clip_by_value(src_x, 0.0, tf.cast(last_x, tf.float32))
    src_y = tf.clip_by_value(src_y, 0.0, tf.cast(last_y, tf.float32))
    x0f, y0f = tf.floor(src_x), tf.floor(src_y)
    fx, fy = (src_x - x0f)[..., None], (src_y - y0f)[..., None]
    x0, y0 = tf.cast(x0f, tf.int32), tf.cast(y0f, tf.int32)
    x1, y1 = tf.minimum(x0 + 1, last_x), tf.minimum(y0 + 1, last_y)

    def at(y, x):
        return tf.cast(_pixels(canvas, y, x), tf.float32)

    return _bilinear(at(y0, x0), at(y0, x1), at(y1, x0), at(y1, x1), fx, fy)


def _pixels(canvas, y, x):
    # gather_nd over (row, column) within each picture gives what a gather from the flattened batch at a
    # computed offset gives, and under XLA on a CPU costs 3-5% less with border padding, 15% less with
    # white padding (bench/warp_kernels.py).
    return tf.gather_nd(canvas, tf.stack([y, x], axis=-1), batch_dims=1)


def _bilinear(top_left, top_right, bottom_left, bottom_right, fx, fy):
    top = top_left + (top_right - top_left) * fx
    bottom = bottom_left + (bottom_right - bottom_left) * fx
    return (top + (bottom - top) * fy) * (1.0 / 255.0)


def _sample_on_white(canvas, src_x, src_y, last_x, last_y):
    """Bilinear sampling where every pixel outside the picture is white: the picture padded with white."""
    # Far outside the picture every neighbour is white anyway; the bound keeps the int32 casts finite.
    src_x = tf.clip_by_value(src_x, -2.0, tf.cast(last_x, tf.float32) + 2.0)
    src_y = tf.clip_by_value(src_y, -2.0, tf.cast(last_y, tf.float32) + 2.0)
    x0f, y0f = tf.floor(src_x), tf.floor(src_y)
    fx, fy = (src_x - x0f)[..., None], (src_y - y0f)[..., None]
    x0, y0 = tf.cast(x0f, tf.int32), tf.cast(y0f, tf.int32)
    white = tf.constant(float(WHITE))

    def at(y, x):
        inside = (x >= 0) & (x <= last_x) & (y >= 0) & (y <= last_y)
        value = _pixels(canvas, tf.clip_by_value(y, 0, last_y), tf.clip_by_value(x, 0, last_x))
        return tf.where(inside[..., None], tf.cast(value, tf.float32), white)

    return _bilinear(at(y0, x0), at(y0, x0 + 1), at(y0 + 1, x0), at(y0 + 1, x0 + 1), fx, fy)


# Per-image ImageProjectiveTransform evaluates the whole projection for every channel of every
# pixel; one fused XLA loop over the batch is about five times cheaper on a CPU.
@functools.lru_cache(maxsize=None)
def _compiled_warp(output_size, white=False):
    return tf.function(lambda c, p, s: _warp(c, p, s, output_size, white), jit_compile=True, reduce_retracing=True,
                       autograph=False)


@functools.lru_cache(maxsize=None)
def _compiled_transform(output_size, augmentation, white=False):
    def transform(canvas, content_size, zoom, uniforms):
        # The warp parameters are computed here, batched, rather than per record: fewer ops per record.
        parameters = drawn_parameters(content_size, zoom, uniforms, output_size, augmentation)
        return _warp(canvas, parameters, content_size, output_size, white)

    # No autograph: every branch here is on Python values, and converting this module's source cost
    # ~1.3 s of each train-project start (py-spy, docs/performance.md).
    return tf.function(transform, jit_compile=True, reduce_retracing=True, autograph=False)


def _pad_batch(batch_size, tensors, fill):
    # The compiled kernels then see one shape whatever the number of images that survived decoding.
    count = tf.shape(tensors[0])[0]
    padded = []
    for tensor, value in zip(tensors, fill):
        padding = [[0, batch_size - count]] + [[0, 0]] * (len(tensor.shape) - 1)
        padded.append(tf.pad(tensor, padding, constant_values=value))
    return count, padded


def warp_batch(canvas, parameters, content_size, output_size, batch_size, fill: Fill = Fill()):
    """Warp canvases (uint8 [b, H', W', 3], content top-left) with explicit parameters [b, 6].

    Returns float32 [b, height, width, 3] in [0, 1]; b <= batch_size.
    """
    count, padded = _pad_batch(batch_size, [canvas, parameters, content_size], [0, 0, 1])
    return _compiled_warp(tuple(output_size), fill.white_padding)(*padded)[:count]


def transform_batch(canvas, content_size, zoom, uniforms, output_size, augmentation, batch_size, fill: Fill = Fill()):
    """The pipeline's per-batch step: warp parameters from (content size, zoom, uniforms), then the warp.

    augmentation None is inference (identity warp, uniforms ignored). `fill` decides what lies outside the
    picture (pipeline.fill).
    """
    count, padded = _pad_batch(batch_size, [canvas, content_size, zoom, uniforms], [0, 1, 1, 0])
    return _compiled_transform(tuple(output_size), augmentation, fill.white_padding)(*padded)[:count]


@functools.lru_cache(maxsize=None)
def _compiled_scale():
    return tf.function(lambda images: tf.cast(images, tf.float32) * (1.0 / 255.0), jit_compile=True,
                       reduce_retracing=True, autograph=False)


def scale_batch(images, batch_size):
    """uint8 [b, h, w, 3] (b <= batch_size) -> float32 in [0, 1], as the warp's last step scales.

    One compiled pass: as two TensorFlow ops (cast, then multiply) it cost 0.30 against 0.18 CPU-ms a
    448x448 picture on one core, with the same values.
    """
    count, (padded,) = _pad_batch(batch_size, [images], [0])
    return _compiled_scale()(padded)[:count]
