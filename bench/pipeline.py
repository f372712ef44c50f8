"""Input pipeline throughput: training batches exactly as training makes them vs the read + decode + resize bound.

    python bench/pipeline.py [--dataset DIR --tags FILE] [--size 299] [--batch 32] [--images N]
                             [--slice-batches B] [--repeats R] [--large-images M]

Without --dataset it generates a DeepDanbooru-layout dataset of N 512x512 JPEGs
in a temporary directory. Each timed pass is one dataset over B batches of
records cycling through the N images, like one training slice (the trainer
builds one dataset per slice of checkpoint_frequency_mb batches), start-up
included. (a) `pipeline`: deepdanbooru.pipeline.training_dataset with the
project.json default augmentation (rotation 0-360, scale 0.9-1.1, shift
+-0.1), labels, positions and the bad-image bookkeeping the trainer does.
(b) `bound`: read + tf.io.decode_image + bilinear resize to fit + centre pad +
/255, same batch size and parallelism, no augmentation. The two alternate R
times. `ratio` is the median over the R back-to-back pairs (a pipeline pass
and the bound pass right after it see about the same load from other
processes); best-of-R and per-CPU-second ratios are printed too. With --large-images M > 0 it also generates M
2000x1500 JPEGs and compares the pipeline with and without libjpeg's DCT
scaling against the same bound. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

DEFAULT_AUGMENTATION = {"rotation_range": (0.0, 360.0), "scale_range": (0.9, 1.1), "shift_range": (-0.1, 0.1)}
BENCH_TAGS = [f"tag_{i}" for i in range(1000)]


def _illustration(rng, height, width) -> Image.Image:
    # Smooth colour fields, grain and strokes: compresses and decodes like a drawing, not like noise.
    field = Image.fromarray((rng.random((12, 12, 3)) * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
    pixels = np.asarray(field).astype(np.int16) + rng.integers(-10, 11, (height, width, 3), dtype=np.int16)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(24):
        points = [tuple(int(v) for v in rng.integers(0, (width, height))) for _ in range(2)]
        draw.line(points, fill=tuple(int(v) for v in rng.integers(0, 256, 3)), width=int(rng.integers(1, 5)))
    return image


def generate_dataset(directory: Path, count: int, height: int, width: int, seed: int,
                     quality: int = 90) -> tuple[Path, Path]:
    """A DeepDanbooru-layout dataset (SQLite posts + images/xx/md5.jpg) and its tags.txt."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "bench.sqlite"
    rows = []
    for post_id in range(1, count + 1):
        md5 = hashlib.md5(f"{seed}-{post_id}".encode()).hexdigest()
        path = directory / "images" / md5[:2] / f"{md5}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        _illustration(rng, height, width).save(path, quality=quality)
        tags = " ".join(rng.choice(BENCH_TAGS, size=int(rng.integers(5, 40)), replace=False))
        rows.append((post_id, md5, "jpg", tags, len(tags.split())))
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, "
                           "tag_string TEXT, tag_count_general INTEGER)")
        connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?)", rows)
    tags_path = directory / "tags.txt"
    tags_path.write_text("\n".join(BENCH_TAGS) + "\n", encoding="utf-8")
    return database, tags_path


def load_dataset(directory: Path, tags_path: Path, limit: int):
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.project.config import IMAGE_EXTENSIONS
    from deepdanbooru.project.tags import load_tags

    databases = sorted(p for p in directory.iterdir() if p.suffix in (".sqlite", ".sqlite3", ".db"))
    if not databases:
        sys.exit(f"{directory}: no .sqlite/.sqlite3/.db file")
    records = load_records(databases[0], 0, IMAGE_EXTENSIONS)
    if len(records) == 0:
        sys.exit(f"{databases[0]}: no eligible posts")
    count = min(limit, len(records))
    return records.paths()[:count], records.tag_strings[:count], load_tags(tags_path)


def cycle(paths, tag_strings, count: int):
    """The first `count` records of the records repeated: one slice's worth of work."""
    repeats = -(-count // len(paths))
    return (paths * repeats)[:count], (list(tag_strings) * repeats)[:count]


def bound_dataset(paths, size: int, batch: int):
    import tensorflow as tf

    def load(path):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        factor = tf.minimum(size / shape[0], size / shape[1])
        target = tf.maximum(tf.cast(tf.round(shape * factor), tf.int32), 1)
        resized = tf.image.resize(image, target, method="bilinear")
        return tf.image.resize_with_crop_or_pad(resized, size, size) / 255.0

    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(paths, tf.string))
    dataset = dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.batch(batch).prefetch(tf.data.AUTOTUNE)


def pipeline_dataset(paths, tag_strings, tags, size: int, batch: int, dct_scaling: bool = True):
    from deepdanbooru.pipeline import Augmentation, TrainingInput, training_dataset

    options = TrainingInput(size, size, Augmentation(**DEFAULT_AUGMENTATION), seed=0, batch_size=batch,
                            max_image_pixels=89_478_485)
    return training_dataset(paths, tag_strings, tags, options, random_seed=0, start_position=0,
                            jpeg_dct_scaling=dct_scaling)


def timed_pass(make_dataset, log_dir: Path, paths, max_image_pixels=89_478_485) -> tuple[float, float]:
    """(images per wall second, images per CPU second of this process) for one full pass, start-up included."""
    from deepdanbooru.pipeline import BadImageTracker

    tracker = BadImageTracker(log_dir / "bad_images.txt", paths, max_image_pixels=max_image_pixels)
    wall, cpu = time.perf_counter(), time.process_time()
    count = 0
    accounted = False
    for batch in make_dataset():
        if isinstance(batch, dict):
            accounted = True
            tracker.observe(batch["position"].numpy())
            batch["label"].numpy()
            images = batch["image"]
        else:
            images = batch
        # tf.data hands over each batch computed; the trainer passes the tensor to its step as it is, so no
        # .numpy() here: that copies the batch (float32, 77 MB at 448), about 0.5-1 CPU-ms a picture.
        count += int(images.shape[0])
    if accounted:
        tracker.finish(0, len(paths))  # the trainer's end-of-slice check
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if count != len(paths):
        sys.exit(f"a pass produced {count} images for {len(paths)} records")
    return count / wall, count / cpu


def compare(contestants: dict, repeats: int, log_dir: Path, paths) -> dict[str, dict[str, float]]:
    for make in contestants.values():  # warm-up: tracing, XLA compilation, file cache
        timed_pass(make, log_dir, paths)
    passes: dict[str, list] = {name: [] for name in contestants}
    for _ in range(repeats):
        for name, make in contestants.items():
            passes[name].append(timed_pass(make, log_dir, paths))
    results = {}
    for name, values in passes.items():
        walls = [w for w, _ in values]
        results[name] = {"best": max(walls), "median": float(np.median(walls)),
                         "cpu": max(c for _, c in values), "walls": walls}
        print(f"  {name:<22} best {results[name]['best']:7.0f} images/s   median {results[name]['median']:7.0f}"
              f"   {results[name]['cpu']:6.0f} images per CPU-second   passes: "
              + " ".join(f"{w:.0f}" for w in walls), flush=True)
    return results


# The generated originals --kind picks: (height, width, JPEG quality). "tall": Danbooru-sized 1536x2048 at
# about 2.0 bits a pixel; "square": 1536x1536 at about 1.4 bits a pixel, which decode faster, so packing gains less.
KINDS = {"tall": (2048, 1536, 90), "square": (1536, 1536, 85)}


def make_packed_project(directory: Path, originals: int, size: int, batch: int, kind: str = "tall",
                        pack_quality: int = 95) -> Path:
    """A project at `size` with the default augmentation over `originals` generated JPEGs of `kind` (KINDS)."""
    height, width, quality = KINDS[kind]
    print(f"generating {originals} {width}x{height} JPEGs (quality {quality}) ...", flush=True)
    database, tags_path = generate_dataset(directory / "dataset", originals, height, width, seed=3, quality=quality)
    project = directory / "project"
    project.mkdir()
    config = {"image_width": size, "image_height": size, "database_path": str(database), "minimum_tag_count": 1,
              "minibatch_size": batch, "pack_quality": pack_quality}
    (project / "project.json").write_text(json.dumps(config, indent=2))
    (project / "tags.txt").write_text(tags_path.read_text())
    return project


def offset_reads(index, reader, count: int = 64) -> dict:
    """Random access into a shard: TensorFlow's FixedLengthRecordDataset at an offset vs the shard reader's read."""
    import tensorflow as tf

    locations = list(index.locations.values())[::-1][:count]  # the records furthest into their shards first
    started = time.perf_counter()
    for number, offset, length in locations:
        size = index.sizes[number]
        records = tf.data.FixedLengthRecordDataset(str(index.files[number]), length, header_bytes=offset,
                                                   footer_bytes=size - offset - length)
        next(iter(records))
    tf_ms = (time.perf_counter() - started) / len(locations) * 1000
    started = time.perf_counter()
    for path in list(index.locations)[::-1][:count]:
        reader.read(path)
    checked_ms = (time.perf_counter() - started) / len(locations) * 1000
    mean_offset = sum(offset for _, offset, _ in locations) / len(locations)
    print(f"one record at a mean offset of {mean_offset / 1e6:.1f} MB: FixedLengthRecordDataset {tf_ms:.2f} ms, "
          f"the shard reader (CRCs checked) {checked_ms:.3f} ms", flush=True)
    return {"offset_read_tf_ms": round(tf_ms, 3), "offset_read_checked_ms": round(checked_ms, 4),
            "offset_read_mean_offset_bytes": round(mean_offset)}


def open_packed(project):
    """(config, tags, records, ShardIndex, ShardReader) of a packed project; exits when it has no shards."""
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.pipeline.packed import ShardReader
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.paths import ProjectPaths
    from deepdanbooru.project.shards import open_shards
    from deepdanbooru.project.tags import load_tags

    paths = ProjectPaths(project)
    config = load_config(paths.root)
    records = load_records(config.require_database(), config.minimum_tag_count, config.image_extensions)
    index = open_shards(paths.root, config, paths.tags, records)
    if index is None:
        sys.exit(f"{project}: no shards; run `deepdanbooru pack {project}` first")
    return config, load_tags(paths.tags), records, index, ShardReader(index)


def packed_main(args) -> int:
    """Training batches of one project from its shards against the same batches from its original files."""
    import tensorflow as tf

    from deepdanbooru.packing.pack import pack_project
    from deepdanbooru.pipeline import TrainingInput, training_dataset

    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="bench-packed-") as scratch:
        scratch = Path(scratch)
        project = args.project or make_packed_project(scratch, args.originals, args.size, args.batch, args.kind,
                                                          args.pack_quality)
        summary = {"cores": cores, "kind": None if args.project else args.kind,
                   "pack_quality": None if args.project else args.pack_quality,
                   "load_average_before": round(os.getloadavg()[0], 2)}
        if args.project is None:
            wall, cpu = time.perf_counter(), time.process_time()
            packed = pack_project(project, workers=args.pack_workers, echo=lambda line: print(line, flush=True))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            count = packed.pictures + packed.bad
            summary.update({"pack_s_per_picture": round(wall / count, 4),
                            "pack_cpu_s_per_picture": round(cpu / count, 4),
                            "bytes_per_picture": round(packed.bytes / packed.pictures),
                            "original_bytes_per_picture": round(sum(
                                p.stat().st_size for p in (scratch / "dataset" / "images").rglob("*.jpg")) / count)})
            height, width, _ = KINDS[args.kind]
            summary["original_bits_per_pixel"] = round(summary["original_bytes_per_picture"] * 8 / (height * width), 2)
            print(f"packing: {summary['pack_s_per_picture'] * 1000:.1f} ms a picture on {cores} core(s) "
                  f"({summary['pack_cpu_s_per_picture'] * 1000:.1f} CPU-ms in this process), "
                  f"{summary['bytes_per_picture'] / 1e3:.1f} kB a picture on disk "
                  f"(originals {summary['original_bytes_per_picture'] / 1e3:.0f} kB)", flush=True)
        config, tags, records, index, reader = open_packed(project)
        options = TrainingInput.from_config(config)
        paths, tag_strings = cycle(records.paths()[:args.images], records.tag_strings[:args.images],
                                   args.slice_batches * options.batch_size)
        print(f"{min(args.images, len(records))} pictures of {project}, {config.image_height}x{config.image_width}, "
              f"batch {options.batch_size}, passes of {len(paths)} records, TensorFlow {tf.__version__}, "
              f"{cores} core(s)", flush=True)

        def raw():
            return training_dataset(paths, tag_strings, tags, options, random_seed=0, start_position=0)

        def packed_():
            return training_dataset(paths, tag_strings, tags, options, random_seed=0, start_position=0,
                                    shards=reader)

        summary.update(offset_reads(index, reader))
        results = compare({"original files": raw, "shards": packed_}, args.repeats, scratch, paths)
        walls = zip(results["shards"]["walls"], results["original files"]["walls"])
        summary.update({
            "raw_images_per_s": round(results["original files"]["best"], 1),
            "packed_images_per_s": round(results["shards"]["best"], 1),
            "raw_images_per_cpu_s": round(results["original files"]["cpu"], 1),
            "packed_images_per_cpu_s": round(results["shards"]["cpu"], 1),
            "ratio": round(float(np.median([p / r for p, r in walls])), 2),
            "ratio_cpu": round(results["shards"]["cpu"] / results["original files"]["cpu"], 2),
            "packed_images_per_s_per_core": round(results["shards"]["best"] / cores, 1),
            "size": config.image_height, "batch": options.batch_size, "load_average_after": round(os.getloadavg()[0], 2),
        })
        print(f"shards / original files: {summary['ratio']:.2f}x (median of back-to-back pairs), "
              f"{summary['ratio_cpu']:.2f}x per CPU-second; shards: {summary['packed_images_per_s_per_core']:.0f} "
              f"pictures/s per core, {summary['packed_images_per_cpu_s']:.0f} per CPU-second", flush=True)
    print(json.dumps(summary))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="with --packed: a packed project to measure")
    parser.add_argument("--packed", action="store_true",
                        help="compare training batches from the project's shards with the same batches from its "
                             "original files (without --project: generate --originals 1536x2048 JPEGs, a project "
                             "at --size and pack it, timed)")
    parser.add_argument("--originals", type=int, default=200, help="with --packed: originals to generate")
    parser.add_argument("--kind", choices=sorted(KINDS), default="tall",
                        help="with --packed: the generated originals: tall (1536x2048, quality 90, about 2.0 bits a "
                             "pixel) or square (1536x1536, quality 85, about 1.4 bits a pixel)")
    parser.add_argument("--pack-quality", type=int, default=95,
                        help="with --packed: project.json's pack_quality of the generated project (default 95)")
    parser.add_argument("--pack-workers", type=int, default=1, help="with --packed: deepdanbooru pack --workers")
    parser.add_argument("--cores", type=int, default=0,
                        help="run on this many cores only (os.sched_setaffinity; 0: all; --packed defaults to 1)")
    parser.add_argument("--dataset", type=Path, help="DeepDanbooru-layout dataset directory (default: generated)")
    parser.add_argument("--tags", type=Path, help="tags.txt (required with --dataset)")
    parser.add_argument("--size", type=int, help="training size (default 299; 448 with --packed)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--images", type=int, default=512, help="distinct images (default 512)")
    parser.add_argument("--slice-batches", type=int, default=100, help="batches per timed pass (default 100)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large-images", type=int, default=64,
                        help="also measure this many generated 2000x1500 JPEGs, passes of 8 batches (0: skip)")
    args = parser.parse_args(argv)
    if args.dataset and not args.tags:
        parser.error("--tags is required with --dataset")
    if args.project and not args.packed:
        parser.error("--project is for --packed")
    args.size = args.size or (448 if args.packed else 299)
    cores = args.cores or (1 if args.packed else 0)
    if cores:
        # Before TensorFlow starts: its thread pools and tf.data's parallelism follow the affinity.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
    if args.packed:
        return packed_main(args)

    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as scratch:
        scratch = Path(scratch)
        if args.dataset:
            dataset_dir, tags_path = args.dataset, args.tags
        else:
            print(f"generating {args.images} 512x512 JPEGs ...", flush=True)
            _, tags_path = generate_dataset(scratch / "small", args.images, 512, 512, seed=1)
            dataset_dir = scratch / "small"
        paths, tag_strings, tags = load_dataset(dataset_dir, tags_path, args.images)
        print(f"{len(paths)} images from {dataset_dir}, {len(tags)} tags, size {args.size}, batch {args.batch}, "
              f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs", flush=True)
        distinct = len(paths)
        paths, tag_strings = cycle(paths, tag_strings, args.slice_batches * args.batch)
        print(f"passes of {len(paths)} records ({args.slice_batches} batches)", flush=True)

        def pipeline():
            return pipeline_dataset(paths, tag_strings, tags, args.size, args.batch)

        def bound():
            return bound_dataset(paths, args.size, args.batch)

        main_results = compare({"pipeline": pipeline, "bound": bound}, args.repeats, scratch, paths)
        pipeline_walls, bound_walls = main_results["pipeline"]["walls"], main_results["bound"]["walls"]
        summary = {
            "pipeline_images_per_s": round(main_results["pipeline"]["best"], 1),
            "bound_images_per_s": round(main_results["bound"]["best"], 1),
            # Each pipeline pass against the bound pass right after it: both saw about the same load.
            "ratio": round(float(np.median([p / b for p, b in zip(pipeline_walls, bound_walls)])), 3),
            "ratio_best": round(main_results["pipeline"]["best"] / main_results["bound"]["best"], 3),
            "ratio_cpu": round(main_results["pipeline"]["cpu"] / main_results["bound"]["cpu"], 3),
            "images": distinct, "records_per_pass": len(paths), "size": args.size, "batch": args.batch,
            "cpus": os.cpu_count(),
        }
        print(f"ratio pipeline / bound: {summary['ratio']:.3f} (median of back-to-back pairs), "
              f"{summary['ratio_best']:.3f} (best / best), {summary['ratio_cpu']:.3f} (per CPU-second)", flush=True)
        if abs(summary["ratio"] - summary["ratio_cpu"]) > 0.2 * summary["ratio_cpu"]:
            print("warning: wall-clock and per-CPU-second ratios disagree by more than 20%: other processes were "
                  "competing for the CPUs; trust the per-CPU-second ratio or rerun on a quiet machine", flush=True)

        if args.large_images > 0:
            print(f"generating {args.large_images} 2000x1500 JPEGs ...", flush=True)
            _, large_tags_path = generate_dataset(scratch / "large", args.large_images, 1500, 2000, seed=2)
            large_paths, large_strings, large_tags = load_dataset(scratch / "large", large_tags_path,
                                                                  args.large_images)
            large_paths, large_strings = cycle(large_paths, large_strings, 8 * args.batch)

            def pipeline_dct():
                return pipeline_dataset(large_paths, large_strings, large_tags, args.size, args.batch, True)

            def pipeline_full_decode():
                return pipeline_dataset(large_paths, large_strings, large_tags, args.size, args.batch, False)

            def bound_large():
                return bound_dataset(large_paths, args.size, args.batch)

            large = compare({"pipeline (DCT scaling)": pipeline_dct, "pipeline (full decode)": pipeline_full_decode,
                             "bound (full decode)": bound_large}, args.repeats, scratch, large_paths)
            walls = {name: value["walls"] for name, value in large.items()}
            cpu = {name: value["cpu"] for name, value in large.items()}

            def paired(numerator, denominator):
                return round(float(np.median([a / b for a, b in zip(walls[numerator], walls[denominator])])), 3)

            summary.update({
                "large_pipeline_dct_images_per_s": round(large["pipeline (DCT scaling)"]["best"], 1),
                "large_pipeline_full_decode_images_per_s": round(large["pipeline (full decode)"]["best"], 1),
                "large_bound_images_per_s": round(large["bound (full decode)"]["best"], 1),
                "large_dct_speedup": paired("pipeline (DCT scaling)", "pipeline (full decode)"),
                "large_ratio": paired("pipeline (DCT scaling)", "bound (full decode)"),
                "large_dct_speedup_cpu": round(cpu["pipeline (DCT scaling)"] / cpu["pipeline (full decode)"], 2),
                "large_ratio_cpu": round(cpu["pipeline (DCT scaling)"] / cpu["bound (full decode)"], 3),
            })
            print(f"large sources: DCT scaling speeds the pipeline up {summary['large_dct_speedup']:.2f}x "
                  f"({summary['large_dct_speedup_cpu']:.2f}x per CPU-second); pipeline / full-decode bound = "
                  f"{summary['large_ratio']:.3f} ({summary['large_ratio_cpu']:.3f} per CPU-second)", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
