"""Tagging a folder: our batched evaluate path vs DeepDanbooru-style one-image-at-a-time prediction.

    python bench/evaluate.py [--images 128] [--size 128] [--batch-size 32] [--repeats 3]

Both tag the same JPEGs with the same model (resnet_small, random weights:
speed does not depend on them) and must agree on the scores.

- ours: deepdanbooru.inference.predict.Tagger.predict, i.e. the shared tf.data
  inference pipeline (parallel read/decode/resize/pad) feeding one traced
  model call per batch.
- DeepDanbooru-style: per image, read + decode + area-resize keeping aspect
  with TensorFlow, pad by edge replication in numpy, then `model.predict` on a
  batch of one, as DeepDanbooru 1.0's evaluate does (its padding used
  scikit-image's warp, which is slower than the numpy padding used here).

Each side runs once to warm up (tracing), then --repeats times; the best time counts.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_images(folder: Path, count: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        height, width = (256, 192) if index % 2 else (192, 256)
        pixels = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize((width, height), Image.BILINEAR)
        path = folder / f"img{index}.jpg"
        image.save(path, quality=90)
        paths.append(path)
    return paths


def deepdanbooru_style(model, paths, height, width):
    import tensorflow as tf

    results = []
    for path in paths:
        image = tf.io.decode_image(tf.io.read_file(str(path)), channels=3, expand_animations=False)
        image = tf.image.resize(image, (height, width), method="area", preserve_aspect_ratio=True).numpy()
        top = (height - image.shape[0]) // 2
        left = (width - image.shape[1]) // 2
        image = np.pad(image, ((top, height - image.shape[0] - top), (left, width - image.shape[1] - left), (0, 0)),
                       mode="edge") / 255.0
        results.append(model.predict(image[None].astype(np.float32), verbose=0)[0])
    return np.stack(results)


def ours(tagger, paths, batch_size):
    rows = [scores for _, scores in tagger.predict(paths, batch_size, lambda index, reason: None)]
    return np.stack(rows)


def best_of(function, repeats):
    function()  # warm-up: tracing and pipeline start-up are paid once per process
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--tags", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from deepdanbooru.inference.predict import Tagger
    from deepdanbooru.models.builder import build_model

    model = build_model("resnet_small", (args.size, args.size, 3), args.tags, seed=0)
    tagger = Tagger(model, [f"t{i}" for i in range(args.tags)], Path("bench.keras"), max_image_pixels=10**8)
    with tempfile.TemporaryDirectory() as directory:
        paths = make_images(Path(directory), args.images)
        ours_seconds, ours_scores = best_of(lambda: ours(tagger, paths, args.batch_size), args.repeats)
        base_seconds, base_scores = best_of(lambda: deepdanbooru_style(model, paths, args.size, args.size),
                                            args.repeats)
    difference = float(np.max(np.abs(ours_scores - base_scores)))
    ours_rate = args.images / ours_seconds
    base_rate = args.images / base_seconds
    print(f"images: {args.images} JPEGs (256x192 / 192x256) -> resnet_small {args.size}x{args.size}, {args.tags} tags")
    print(f"ours (tf.data pipeline, batch {args.batch_size}): {ours_seconds:.2f} s, {ours_rate:.1f} images/s")
    print(f"DeepDanbooru-style (one model.predict per image): {base_seconds:.2f} s, {base_rate:.1f} images/s")
    print(f"speed-up: {ours_rate / base_rate:.2f}x; largest score difference: {difference:.2g}")
    print(json.dumps({"images": args.images, "size": args.size, "batch_size": args.batch_size,
                      "ours_images_per_s": round(ours_rate, 1), "baseline_images_per_s": round(base_rate, 1),
                      "speedup": round(ours_rate / base_rate, 2), "max_abs_difference": difference}))


if __name__ == "__main__":
    main()
