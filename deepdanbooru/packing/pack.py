"""deepdanbooru pack: decode every eligible picture once, fit it to the training box and write shards.

Resumable shard by shard: `plan.json` (what the shards are made from and how
the records are cut into shards) is written first; each shard is written
whole beside its final name and renamed, then its index; `manifest.json`,
which is all training reads, comes last. An interrupted or failed pack (a full
disk included) leaves finished shards to reuse and nothing that training
would read.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from deepdanbooru.dataset.records import project_records
from deepdanbooru.errors import DatasetError, Interrupted, file_field
from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic
from deepdanbooru.project.config import load_config
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.shards import (
    BYTES_PER_PIXEL_GUESS, MANIFEST, PLAN, SHARDS_DIR, TARGET_SHARD_BYTES, TRAINING_PART, VALIDATION_PART, index_name,
    made_from, rebuild_command, record_key, shard_name, validation_made_from,
)
from deepdanbooru.project.tags import load_tags
from deepdanbooru.scoring.split import split_records
from deepdanbooru.wording import plural, size_text


@dataclass(frozen=True)
class PackSummary:
    pictures: int  # packed
    bad: int  # could not be read or decoded
    shards: int
    bytes: int  # on disk, all shards
    packed_now: int  # shards written by this run (the others were kept from an earlier one)
    seconds: float


def records_per_shard(box) -> int:
    return max(1, int(TARGET_SHARD_BYTES / (box[0] * box[1] * BYTES_PER_PIXEL_GUESS)))


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


_PARTS = (f"{TRAINING_PART}-", f"{VALIDATION_PART}-")


def _clear(directory: Path, parts=_PARTS) -> None:
    """Remove what an earlier pack wrote (shards, indexes, manifest, half-written files), nothing else."""
    for path in directory.iterdir():
        name = path.name
        written = name.startswith(parts) and name.endswith((".tfrecord", ".json"))
        staged = name.startswith(tuple("." + part for part in parts)) and name.endswith(".tmp")
        if (parts == _PARTS and name in (MANIFEST, PLAN)) or written or staged:
            path.unlink()


def _shards_whole(directory: Path, manifest: dict) -> bool:
    """Every shard the manifest lists is there at its packed size (one deleted or cut short is packed again)."""
    try:
        return all((directory / entry["file"]).stat().st_size == entry["bytes"] for entry in manifest["shards"])
    except (OSError, KeyError, TypeError):
        return False


def _finished(directory: Path, number: int, plan_digest: str):
    index = _read_json(directory / index_name(number))
    if not isinstance(index, dict) or index.get("plan") != plan_digest:
        return None
    try:
        size = (directory / shard_name(number)).stat().st_size
    except FileNotFoundError:
        return None
    return index if size == index.get("bytes") else None


# The work of one shard; runs in this process or in a worker process (spawned, so each imports TensorFlow).
_JOB_CONTEXT = {}


def _init_worker(context: dict) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    _JOB_CONTEXT.clear()
    _JOB_CONTEXT.update(context)


def pack_shard(number: int, start: int, stop: int) -> dict:
    """Fit records start..stop-1, write shard `number` and its index; returns the index."""
    import numpy as np
    import tensorflow as tf

    from deepdanbooru.pipeline.badimages import diagnose
    from deepdanbooru.pipeline.packed import example_bytes, fit_function

    context = _JOB_CONTEXT
    directory, images_dir = Path(context["directory"]), context["images_dir"]
    paths = context["paths"][start:stop]
    part = context.get("part", TRAINING_PART)
    fit = fit_function(tuple(context["box"]), context["max_image_pixels"], context["alpha"], context["quality"])
    dataset = tf.data.Dataset.from_tensor_slices((tf.constant(paths, tf.string), np.arange(len(paths))))
    dataset = dataset.map(lambda path, i: (fit(path), i), num_parallel_calls=context["parallel"],
                          deterministic=True).ignore_errors()
    column = {tag: i for i, tag in enumerate(context["tags"])}
    temporary = f"ram://pack-{os.getpid()}-{number}"
    records, packed, offset = [], set(), 0
    with tf.io.TFRecordWriter(temporary) as writer:
        for image, i in dataset.as_numpy_iterator():
            i = int(i)
            key = record_key(paths[i], images_dir)
            labels = sorted({column[tag] for tag in context["tag_strings"][start + i].split() if tag in column})
            example = example_bytes(image, labels, key)
            writer.write(example)
            # TFRecord framing: 8-byte length and its 4-byte CRC, the bytes, their 4-byte CRC.
            records.append([key, offset + 12, len(example)])
            offset += 16 + len(example)
            packed.add(i)
    data = tf.io.gfile.GFile(temporary, "rb").read()
    tf.io.gfile.remove(temporary)
    bad = [[record_key(paths[i], images_dir), diagnose(paths[i], context["max_image_pixels"])]
           for i in range(len(paths)) if i not in packed]
    index = {"plan": context["plan_digest"], "file": shard_name(number, part), "bytes": len(data), "records": records,
             "bad": bad}
    write_bytes_atomic(directory / shard_name(number, part), data)
    write_text_atomic(directory / index_name(number, part), json.dumps(index))
    return index


def _run(jobs, workers: int, context: dict):
    """Yield (number, index) as shards finish; several worker processes when workers > 1."""
    if workers <= 1:
        _init_worker(context)
        for job in jobs:
            yield job[0], pack_shard(*job)
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(context,)) as pool:
        futures = [(job[0], pool.submit(pack_shard, *job)) for job in jobs]
        try:
            for number, future in futures:
                yield number, future.result()
        except BaseException:
            for _, future in futures:
                future.cancel()
            raise


def pack_project(project_dir, workers: int = 1, echo=print, shard_records: int | None = None) -> PackSummary:
    """Pack PROJECT's eligible pictures into PROJECT/shards (see the module docstring)."""
    began = time.perf_counter()
    paths = ProjectPaths(project_dir)
    config = load_config(paths.root)
    tags = load_tags(paths.tags)
    database = config.require_database()
    records = project_records(config, "pack")
    source = made_from(paths.root, config, paths.tags, records)
    directory = paths.root / SHARDS_DIR
    per_shard = shard_records or records_per_shard(source["box"])
    count = math.ceil(len(records) / per_shard)
    # Where the project and its database lie is not part of the plan: a project moved with its shards keeps them.
    content = {key: value for key, value in source.items() if key not in ("project", "database")}
    plan = {"made_from": content, "records_per_shard": per_shard, "shards": count}
    plan_digest = _digest(plan)
    validation = split_records(records, config.validation_fraction, config.seed)[1]
    validation_plan = validation_made_from(config, paths.tags, validation)
    manifest = _read_json(directory / MANIFEST)
    if isinstance(manifest, dict) and manifest.get("plan") == plan_digest and _shards_whole(directory, manifest):
        part = manifest.get("validation")
        if isinstance(part, dict) and part.get("plan") == _digest(validation_plan) and _shards_whole(directory, part):
            held = f", {plural(part['pictures'], 'validation picture')}" if part["pictures"] else ""
            echo(f"{directory}: up to date ({plural(manifest['pictures'], 'picture')} in "
                 f"{plural(count, 'shard')}{held})")
            return PackSummary(manifest["pictures"], manifest["bad"], count, manifest["bytes"], 0, 0.0)
        _pack_validation(paths, directory, manifest, validation, validation_plan, tags, config, echo)
        return PackSummary(manifest["pictures"], manifest["bad"], count, manifest["bytes"], 0,
                           time.perf_counter() - began)
    directory.mkdir(parents=True, exist_ok=True)
    if _read_json(directory / PLAN) != plan:
        _clear(directory)
        write_text_atomic(directory / PLAN, json.dumps(plan, indent=1))
    else:
        (directory / MANIFEST).unlink(missing_ok=True)
    indexes = {n: _finished(directory, n, plan_digest) for n in range(count)}
    jobs = [(n, n * per_shard, min(len(records), (n + 1) * per_shard)) for n in range(count) if indexes[n] is None]
    kept = count - len(jobs)
    workers = max(1, min(workers, len(jobs) or 1))
    echo(f"Packing {plural(len(records), 'picture')} from {database} into {plural(count, 'shard')} in {directory}"
         + (f" ({kept} already packed)" if kept else "") + f", {workers} process{'es' if workers > 1 else ''}")
    context = {"directory": str(directory), "images_dir": str(records.images_dir), "paths": records.paths(),
               "tag_strings": records.tag_strings, "tags": tags, "box": source["box"],
               "max_image_pixels": config.max_image_pixels, "alpha": source["alpha"], "plan_digest": plan_digest,
               "quality": config.pack_quality,
               "parallel": max(1, (os.cpu_count() or 1) // workers)}
    done_pictures = sum(stop - start for n, start, stop in [(n, n * per_shard, min(len(records), (n + 1) * per_shard))
                                                              for n in range(count) if indexes[n] is not None])
    started = time.perf_counter()
    todo_pictures = sum(stop - start for _, start, stop in jobs)
    packed_now = 0
    try:
        for number, index in _run(jobs, workers, context):
            indexes[number] = index
            packed_now += len(index["records"]) + len(index["bad"])
            elapsed = time.perf_counter() - started
            left = elapsed / packed_now * (todo_pictures - packed_now)
            echo(f"  shard {number + 1}/{count}: {len(index['records'])} pictures, {size_text(index['bytes'])}"
                 f"  ({done_pictures + packed_now}/{len(records)} pictures, {elapsed:.0f} s, about {left:.0f} s "
                 "left)")
    except OSError as error:
        shards_kept = sum(index is not None for index in indexes.values())
        what = "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))
        raise DatasetError(file_field(
            error.filename or directory, None,
            f"{what} while packing; {shards_kept} of {count} shards are finished and kept, nothing half-written "
            f"is left; free space and run `{rebuild_command(paths.root)}` again to continue")) from None
    except KeyboardInterrupt:
        raise Interrupted(f"packing stopped with {sum(i is not None for i in indexes.values())} of {count} "
                          f"shards finished; `{rebuild_command(paths.root)}` continues") from None
    summary = _finish(paths, directory, source, plan_digest, [indexes[n] for n in range(count)], config,
                      len(jobs), time.perf_counter() - began, echo)
    _pack_validation(paths, directory, _read_json(directory / MANIFEST), validation, validation_plan, tags, config,
                     echo)
    return dataclasses.replace(summary, seconds=time.perf_counter() - began)


def _pack_validation(paths, directory, manifest, validation, plan, tags, config, echo) -> None:
    """Pack the validation records as scoring fits them (image size, no augmentation) and add them to the manifest.

    Small (validation_fraction of the records), so packed whole in this process whenever it is out of date.
    """
    if manifest.pop("validation", None) is not None:
        # First unlisted, then removed: a reader never meets a listed part whose files are gone.
        write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=1))
    _clear(directory, (f"{VALIDATION_PART}-",))
    digest = _digest(plan)
    per_shard = records_per_shard(plan["box"])
    count = math.ceil(len(validation) / per_shard)
    context = {"directory": str(directory), "images_dir": str(validation.images_dir), "paths": validation.paths(),
               "tag_strings": validation.tag_strings, "tags": tags, "box": plan["box"],
               "max_image_pixels": config.max_image_pixels, "alpha": plan["alpha"], "plan_digest": digest,
               "quality": config.pack_quality,
               "parallel": max(1, os.cpu_count() or 1), "part": VALIDATION_PART}
    if count:
        echo(f"Packing {plural(len(validation), 'validation picture')} at {plan['box'][0]}x{plan['box'][1]} into "
             f"{plural(count, 'shard')}")
    jobs = [(n, n * per_shard, min(len(validation), (n + 1) * per_shard)) for n in range(count)]
    indexes = [index for _, index in _run(jobs, 1, context)]
    bad = {f"{validation.images_dir}/{key}": reason for index in indexes for key, reason in index["bad"]}
    if bad:
        order = sorted(bad)
        from deepdanbooru.pipeline.badimages import BadImageTracker

        BadImageTracker(paths.bad_images, order, max_image_pixels=config.max_image_pixels, context="pack validation",
                        diagnose_path=lambda path, _: bad[path]).finish(0, len(order))
    pictures = sum(len(index["records"]) for index in indexes)
    manifest["validation"] = {
        "plan": digest, "made_from": plan, "pictures": pictures, "bad": len(bad),
        "bytes": sum(index["bytes"] for index in indexes),
        "shards": [{"file": index["file"], "index": index_name(n, VALIDATION_PART), "bytes": index["bytes"],
                    "pictures": len(index["records"]), "bad": len(index["bad"])} for n, index in enumerate(indexes)]}
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=1))
    if count:
        echo(f"Packed {plural(pictures, 'validation picture')}" + (f" ({len(bad)} could not be read)" if bad else ""))


def _finish(paths, directory, source, plan_digest, indexes, config, packed_now, seconds, echo) -> PackSummary:
    from deepdanbooru.pipeline.badimages import BadImageTracker

    images_dir = Path(source["database"]).parent / "images"
    bad = {f"{images_dir}/{key}": reason for index in indexes for key, reason in index["bad"]}
    if bad:
        # Logged as training logs the pictures it drops, with the same reasons.
        order = sorted(bad)
        tracker = BadImageTracker(paths.bad_images, order, max_image_pixels=config.max_image_pixels,
                                  context="pack", diagnose_path=lambda path, _: bad[path])
        tracker.finish(0, len(order))
    pictures = sum(len(index["records"]) for index in indexes)
    total = sum(index["bytes"] for index in indexes)
    manifest = {"plan": plan_digest, "made_from": source, "pictures": pictures, "bad": len(bad), "bytes": total,
                "shards": [{"file": index["file"], "index": index_name(n), "bytes": index["bytes"],
                            "pictures": len(index["records"]), "bad": len(index["bad"])}
                           for n, index in enumerate(indexes)]}
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=1))
    per_picture = total / pictures if pictures else 0
    echo(f"Packed {plural(pictures, 'picture')} into {plural(len(indexes), 'shard')}: {size_text(total)}, {size_text(per_picture)} a "
         f"picture, {seconds:.1f} s" + (f"; {len(bad)} could not be read, listed in {paths.bad_images}" if bad else ""))
    return PackSummary(pictures, len(bad), len(indexes), total, packed_now, seconds)
