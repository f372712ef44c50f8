"""The per-batch warp's sampling, two ways side by side: pixel gathers by (row, column) against flat offsets.

    python bench/warp_kernels.py [--size 448] [--batch 32] [--rounds 6]

Times the pipeline's compiled warp (transform_batch: gather_nd over (row,
column) within each picture) against the same bilinear sampling written as a
gather from the flattened batch at a computed offset (the pipeline's kernel
until 2026-12-06, kept here as the reference), on one core of this process
(pinned before TensorFlow starts), with the default augmentation (rotation
0-360, scale 0.9-1.1, shift +-0.1) on random 8-bit canvases. Both must give
bit-identical batches, border and white padding; the bench stops if they do
not. Prints CPU-ms a picture (best of --rounds, alternating) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def flat_offset_warp(tf, transform, output_size, augmentation, white):
    """The reference: every neighbour read as row `base + y * width + x` of the batch's pixels [-1, 3]."""

    def warp(canvas, content_size, zoom, uniforms):
        scale, angle, shift = transform.augmentation_values(uniforms, augmentation)
        parameters = transform.warp_parameters(content_size, zoom, output_size, scale, angle, shift)
        batch, height, width = tf.shape(canvas)[0], tf.shape(canvas)[1], tf.shape(canvas)[2]
        p = parameters[:, :, None, None]
        ys = tf.range(output_size[0], dtype=tf.float32)[None, :, None]
        xs = tf.range(output_size[1], dtype=tf.float32)[None, None, :]
        src_x = p[:, 0] * xs + p[:, 1] * ys + p[:, 4]
        src_y = p[:, 2] * xs + p[:, 3] * ys + p[:, 5]
        last_y = (content_size[:, 0] - 1)[:, None, None]
        last_x = (content_size[:, 1] - 1)[:, None, None]
        low = -2.0 if white else 0.0
        src_x = tf.clip_by_value(src_x, low, tf.cast(last_x, tf.float32) - low)
        src_y = tf.clip_by_value(src_y, low, tf.cast(last_y, tf.float32) - low)
        x0f, y0f = tf.floor(src_x), tf.floor(src_y)
        fx, fy = (src_x - x0f)[..., None], (src_y - y0f)[..., None]
        x0, y0 = tf.cast(x0f, tf.int32), tf.cast(y0f, tf.int32)
        pixels = tf.reshape(canvas, [-1, 3])
        base = (tf.range(batch) * height * width)[:, None, None]

        def at(y, x):
            if not white:
                return tf.cast(tf.gather(pixels, base + y * width + x), tf.float32)
            value = tf.gather(pixels, base + tf.clip_by_value(y, 0, last_y) * width + tf.clip_by_value(x, 0, last_x))
            inside = (x >= 0) & (x <= last_x) & (y >= 0) & (y <= last_y)
            return tf.where(inside[..., None], tf.cast(value, tf.float32), 255.0)

        x1, y1 = (x0 + 1, y0 + 1) if white else (tf.minimum(x0 + 1, last_x), tf.minimum(y0 + 1, last_y))
        top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * fx
        bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * fx
        return (top + (bottom - top) * fy) * (1.0 / 255.0)

    return tf.function(warp, jit_compile=True, autograph=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])

    import numpy as np
    import tensorflow as tf

    from deepdanbooru.pipeline import transform
    from deepdanbooru.pipeline.fill import Fill

    augmentation = transform.Augmentation((0.0, 360.0), (0.9, 1.1), (-0.1, 0.1))
    output_size = (args.size, args.size)
    canvas_h, canvas_w = transform.canvas_size(*output_size, augmentation.box_factor)
    rng = np.random.default_rng(0)
    canvas = tf.constant(rng.integers(0, 256, (args.batch, canvas_h, canvas_w, 3), dtype=np.uint8))
    # Pictures as packed ones are: the box's full width or height, the other side shorter.
    sides = rng.integers(canvas_h // 2, canvas_h + 1, args.batch)
    content = tf.constant(np.stack([np.full(args.batch, canvas_h), sides], 1).astype(np.int32))
    zoom = tf.ones([args.batch])
    uniforms = tf.constant(rng.uniform(0, 1, (args.batch, 4)).astype(np.float32))
    print(f"warp to {args.size}x{args.size}, batch {args.batch}, canvas {canvas_h}x{canvas_w}, one core")
    for padding in ("border", "white"):
        fill = Fill(padding=padding)
        reference = flat_offset_warp(tf, transform, output_size, augmentation, fill.white_padding)
        kernels = {
            "flat offsets": lambda: reference(canvas, content, zoom, uniforms),
            "gather_nd by (row, column)": lambda: transform.transform_batch(
                canvas, content, zoom, uniforms, output_size, augmentation, args.batch, fill),
        }
        outputs = {name: run().numpy() for name, run in kernels.items()}
        first, second = outputs.values()
        if not np.array_equal(first, second):
            print(f"{padding}: the kernels differ (largest difference {np.abs(first - second).max()})")
            return 1
        best = {name: float("inf") for name in kernels}
        for _ in range(args.rounds):
            for name, run in kernels.items():
                started = time.process_time()
                run().numpy()
                best[name] = min(best[name], (time.process_time() - started) / args.batch * 1000)
        for name, value in best.items():
            print(f"{padding:>6} padding, {name:<28} {value:6.2f} CPU-ms a picture")
        flat, nd = best.values()
        print(f"{padding:>6} padding, flat offsets / gather_nd: {flat / nd:.2f}x (identical batches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
