"""Where a packed picture's CPU time goes: the parts of the shard path measured one by one on one core.

    python bench/packed_profile.py --project PROJECT [--batches 16] [--repeats 3]

PROJECT must be packed (`deepdanbooru pack`; bench/pipeline.py --packed makes
one). Measured per picture, in CPU-ms of this process pinned to one core (so
other processes on a shared machine change the wall clock, not these): the
whole training pipeline from the shards and from the original files; the
checked record read through tf.data's numpy_function hop alone; decode_jpeg of
the packed pictures as stored and re-encoded at lower JPEG qualities (with
their size on disk and their mean absolute difference from the stored
pixels); the compiled XLA warp of a batch alone (what original files take);
and OpenCV's decoding and warp of a batch, which packed pictures take, called
directly and then with the maps and the [0, 1] scaling in TensorFlow. The last
line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_ms(work, pictures: int, repeats: int) -> float:
    """Best CPU-ms per picture over `repeats` runs of `work` (after one warm-up run)."""
    work()
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / pictures * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])

    import numpy as np
    import tensorflow as tf

    from pipeline import open_packed

    from deepdanbooru.pipeline import TrainingInput, training_dataset
    from deepdanbooru.pipeline.dataset import _OPTIONS
    from deepdanbooru.pipeline.packed import FEATURES
    from deepdanbooru.pipeline.transform import canvas_size, transform_batch

    config, tags, records, index, reader = open_packed(args.project)
    options = TrainingInput.from_config(config)
    held = [path for path in records.paths() if path in index.locations]
    count = args.batches * options.batch_size
    paths = (held * (count // len(held) + 1))[:count]
    labels = [records.tag_strings[0]] * count
    results = {}

    def pipeline(shards):
        def work():
            for batch in training_dataset(paths, labels, tags, options, random_seed=0, start_position=0,
                                          shards=shards):
                batch["image"].shape  # computed when handed over; .numpy() would add a copy training never makes
        return work

    results["pipeline, original files"] = cpu_ms(pipeline(None), count, 1)
    results["pipeline, shards"] = cpu_ms(pipeline(reader), count, args.repeats)

    def hop():
        dataset = tf.data.Dataset.from_tensor_slices(paths).map(
            lambda path: tf.numpy_function(reader.read, [path], tf.string, stateful=False))
        for _ in dataset.with_options(_OPTIONS):
            pass
    results["checked read + numpy_function hop"] = cpu_ms(hop, count, args.repeats)

    stored = [tf.io.parse_single_example(reader.read(path), FEATURES)["image"].numpy() for path in held]
    pixels = [tf.io.decode_jpeg(data).numpy() for data in stored]
    sizes = {"stored (quality 95)": stored}
    for quality in (90, 85):
        sizes[f"re-encoded at quality {quality}"] = [
            tf.io.encode_jpeg(image, quality=quality, chroma_downsampling=True).numpy() for image in pixels]
    decode = {}
    for name, encoded in sizes.items():
        def work(encoded=encoded):
            dataset = tf.data.Dataset.from_tensor_slices(encoded).map(lambda data: tf.io.decode_jpeg(data, channels=3))
            for _ in dataset.with_options(_OPTIONS):
                pass
        error = float(np.mean([np.abs(tf.io.decode_jpeg(data).numpy().astype(np.int16) - image).mean()
                               for data, image in zip(encoded, pixels)]))
        decode[name] = {"cpu_ms": round(cpu_ms(work, len(encoded), args.repeats), 3),
                        "kb": round(float(np.mean([len(data) for data in encoded])) / 1e3, 1),
                        "mean_abs_difference": round(error, 2)}

    canvas = canvas_size(options.height, options.width, options.augmentation.box_factor)
    batch = options.batch_size
    content = tf.constant([[min(p.shape[0], canvas[0]), min(p.shape[1], canvas[1])] for p in pixels[:1]] * batch,
                          tf.int32)
    canvases = tf.zeros([batch, *canvas, 3], tf.uint8)
    uniforms = tf.random.stateless_uniform([batch, options.augmentation.uniform_count], seed=[1, 2])

    def warp():
        for _ in range(args.batches):
            transform_batch(canvases, content, tf.ones([batch]), uniforms, (options.height, options.width),
                            options.augmentation, batch).numpy()
    results["XLA warp of a batch (per picture)"] = cpu_ms(warp, count, args.repeats)

    from deepdanbooru.pipeline.picturewarp import decode_and_warp_batch, packed_size, warp_packed_batch
    from deepdanbooru.pipeline.transform import drawn_parameters, scale_batch

    output = (options.height, options.width)
    data = stored[0]
    box = (options.height * options.augmentation.box_factor, options.width * options.augmentation.box_factor)
    size, zoom = packed_size(tf.constant(data), box)
    sizes, zooms = tf.stack([size] * batch), tf.fill([batch], zoom)
    maps = drawn_parameters(sizes, zooms, uniforms, output, options.augmentation).numpy()

    def opencv():
        for _ in range(args.batches):
            decode_and_warp_batch([data] * batch, maps, output)
    results["OpenCV decode + warp of a batch, called directly"] = cpu_ms(opencv, count, args.repeats)

    datas = tf.constant([data] * batch)

    def opencv_in_graph():
        for _ in range(args.batches):
            pictures, _ = warp_packed_batch(datas, sizes, zooms, uniforms, output, options.augmentation)
            scale_batch(pictures, batch).shape  # eager: computed; no .numpy() copy
    results["... with the maps and the [0, 1] scaling, in TensorFlow"] = cpu_ms(opencv_in_graph, count, args.repeats)

    print(f"{args.project}: {len(held)} packed pictures, {config.image_height}x{config.image_width}, CPU-ms a "
          "picture on one core")
    for name, value in results.items():
        print(f"  {name:<56} {value:7.3f}")
    for name, value in decode.items():
        print(f"  decode_jpeg, {name:<43} {value['cpu_ms']:7.3f}   {value['kb']:6.1f} kB   mean |difference| "
              f"{value['mean_abs_difference']:.2f} of 255")
    print(json.dumps({"cpu_ms": {k: round(v, 3) for k, v in results.items()}, "decode": decode}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
