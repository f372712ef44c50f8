"""Records -> tf.data batches for training, validation and inference, all through one code path.

Per record, in a parallel map: read, check the header, decode, area-resize to
fit, draw the stateless uniforms (and the mixup weight). Records that fail
anywhere are removed by `ignore_errors()` *before* batching, and every element carries its position, so
the gaps in the positions that come out name exactly the records that were
dropped (BadImageTracker turns them into counts and log lines). Per batch,
after padding onto a fixed canvas: the compiled warp, the multi-hot labels and
mixup. Packed pictures (shards) stay JPEG bytes until the batch step, where
OpenCV decodes and warps them (picturewarp.py) with the same maps.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from deepdanbooru.pipeline.decode import decode_for_box
from deepdanbooru.pipeline.fill import Fill
from deepdanbooru.pipeline.labels import multi_hot, tag_table
from deepdanbooru.pipeline.mixup import mix_batch, mixup_weight
from deepdanbooru.pipeline.transform import (
    BASE_UNIFORMS,
    Augmentation,
    canvas_size,
    fit_into_box,
    place_on_canvas,
    record_uniforms,
    scale_batch,
    seed_hash,
    transform_batch,
)

AUTOTUNE = tf.data.AUTOTUNE
PREFETCH_BATCHES = 2

# No autotuning model: its background thread sometimes outlives the last batch by up to a minute, and
# destroying the iterator waits for it (measured: 28-39 s idle at the end of about one slice in three, in
# the loop's `for batch in dataset`). Without the model, AUTOTUNE parallelism is TensorFlow's fixed
# default (one call per core, at most 16); steady training speed was unchanged on two cores.
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False


def _columns(paths, positions, tag_strings) -> dict:
    columns = {
        # As bytes: a file name that is not UTF-8 (Python holds it with surrogate escapes) cannot become text.
        "path": tf.constant([os.fsencode(path) for path in paths], tf.string, shape=[len(paths)]),
        "position": tf.constant(positions, tf.int64, shape=[len(paths)]),
    }
    if tag_strings is not None:
        if len(tag_strings) != len(paths):
            raise ValueError(f"{len(paths)} paths but {len(tag_strings)} tag strings")
        columns["tags"] = tf.constant(list(tag_strings), tf.string, shape=[len(paths)])
    return columns


def _records(paths, positions, tag_strings):
    return tf.data.Dataset.from_tensor_slices(_columns(paths, positions, tag_strings))


@functools.lru_cache(maxsize=32)
def _record_function(output_size, augmentation, max_image_pixels, jpeg_dct_scaling, mixup, fill, shards=None):
    """The per-record work as one tf.function, traced once per configuration instead of once per dataset.

    The trainer builds a dataset per slice; retracing the decoder graph each
    time cost about half a CPU-second. With `shards` (a packed.ShardReader) the picture comes from the
    shards instead of the file at `path`, and its "canvas" is the packed JPEG's bytes.
    """
    box_factor = augmentation.box_factor if augmentation else 1.0
    canvas = canvas_size(*output_size, box_factor)
    box = (output_size[0] * box_factor, output_size[1] * box_factor)
    uniform_count = augmentation.uniform_count if augmentation else BASE_UNIFORMS

    @tf.function(autograph=False, input_signature=[
        tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)])
    def prepare(path, position, hashed_seed):
        uniforms = record_uniforms(hashed_seed, position, uniform_count)
        weight = mixup_weight(hashed_seed, position, mixup) if mixup else tf.ones([])
        if shards is not None:
            # A packed picture stays JPEG bytes until the batch step decodes and warps the whole batch
            # (picturewarp.py); here only its size is read from the header.
            from deepdanbooru.pipeline.picturewarp import packed_size

            data = shards.jpeg(path)
            size, zoom = packed_size(data, box)
            return data, size, zoom, uniforms, weight
        image, source = decode_for_box(tf.io.read_file(path), max_image_pixels, box, jpeg_dct_scaling, fill)
        content, size, zoom = fit_into_box(image, source, box, canvas)
        return content, size, zoom, uniforms, weight

    return prepare, canvas, uniform_count


def _batching(*, output_size, augmentation, seeds, batch_size, max_image_pixels, tags, num_parallel_calls,
              jpeg_dct_scaling, mixup=None, fill=Fill(),
              shards=None):
    """records dataset -> finished batches (no prefetch): the one batching, for local and data-service input."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if mixup and tags is None:
        raise ValueError("mixup mixes labels: give tags")
    mixup = float(mixup) if mixup else None
    prepare_record, canvas, uniform_count = _record_function(
        tuple(output_size), augmentation, int(max_image_pixels), bool(jpeg_dct_scaling), mixup, fill, shards)
    hashed_seed = seed_hash(*seeds)

    def prepare(record):
        content, size, zoom, uniforms, weight = prepare_record(record["path"], record["position"], hashed_seed)
        prepared = {"canvas": content, "content": size, "zoom": zoom, "uniforms": uniforms,
                    "position": record["position"]}
        if mixup:
            prepared["mixup"] = weight
        if "tags" in record:
            prepared["tags"] = record["tags"]
        return prepared

    table = tag_table(tags) if tags is not None else None

    def finish(batch):
        if shards is not None:
            from deepdanbooru.pipeline.picturewarp import warp_packed_batch

            pictures, decoded = warp_packed_batch(batch["canvas"], batch["content"], batch["zoom"],
                                                  batch["uniforms"], output_size, augmentation, fill.white_padding)
            # A picture OpenCV could not decode leaves its batch like a record that failed earlier: its
            # position never arrives, and the bad-image tracker names it.
            batch = dict(batch, canvas=pictures)
            batch = tf.cond(tf.reduce_all(decoded), lambda: batch,
                            lambda: {key: tf.boolean_mask(value, decoded) for key, value in batch.items()})
            images = scale_batch(batch["canvas"], batch_size)
        else:
            images = transform_batch(batch["canvas"], batch["content"], batch["zoom"], batch["uniforms"],
                                     output_size, augmentation, batch_size, fill)
        out = {"image": tf.ensure_shape(images, [None, *output_size, 3]), "position": batch["position"]}
        if table is not None:
            out["label"] = tf.ensure_shape(multi_hot(batch["tags"], table, len(tags)), [None, len(tags)])
        if mixup:
            out["image"], out["label"] = mix_batch(out["image"], out["label"], batch["mixup"])
        return out

    # tf.data runs autograph over map functions unless told not to; these branch on Python values only.
    prepare = tf.autograph.experimental.do_not_convert(prepare)
    finish = tf.autograph.experimental.do_not_convert(finish)
    # Padding while batching writes each image once, straight into the batch buffer.
    shapes = {"canvas": [canvas[0], canvas[1], 3], "content": [2], "zoom": [], "uniforms": [uniform_count],
              "position": []}
    if tags is not None:
        shapes["tags"] = []
    if mixup:
        shapes["mixup"] = []

    def batches(records):
        dataset = records.map(prepare, num_parallel_calls=num_parallel_calls, deterministic=True)
        dataset = dataset.ignore_errors()
        if shards is not None:
            # Packed records are JPEG bytes and fixed-size numbers: nothing to pad.
            dataset = dataset.batch(batch_size)
        else:
            dataset = dataset.padded_batch(batch_size, padded_shapes=shapes)
        return dataset.map(finish, num_parallel_calls=num_parallel_calls, deterministic=True)

    return batches


def _build(records, **settings):
    return _batching(**settings)(records).prefetch(PREFETCH_BATCHES).with_options(_OPTIONS)


@dataclass(frozen=True)
class TrainingInput:
    """The settings a training dataset takes from project.json; `from_config` is the one mapping."""

    height: int
    width: int
    augmentation: Augmentation
    seed: int
    batch_size: int
    max_image_pixels: int
    mixup: float | None = None  # Beta(alpha, alpha) of the batch mixing; None: off
    fill: Fill = Fill()  # padding and transparency (pipeline.fill)
    data_service: str | None = None  # HOST:PORT of a tf.data service dispatcher that makes the batches; None: here
    # time.monotonic() at which --time-limit ends: waiting for a data-service batch stops there. None: no limit
    deadline: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "mixup", float(self.mixup) if self.mixup else None)

    @classmethod
    def from_config(cls, config) -> TrainingInput:
        augmentation = Augmentation(config.rotation_range, config.scale_range, config.shift_range,
                                    config.horizontal_flip, config.crop_area_range)
        return cls(height=config.image_height, width=config.image_width, augmentation=augmentation,
                   seed=config.seed, batch_size=config.minibatch_size, max_image_pixels=config.max_image_pixels,
                   mixup=config.mixup, fill=Fill.from_config(config), data_service=config.data_service)


def training_dataset(paths, tag_strings, tags, options: TrainingInput, *, random_seed, start_position,
                     positions=None, num_parallel_calls=AUTOTUNE, jpeg_dct_scaling=True, shards=None):
    """Augmented, labelled batches of one slice; see the package docstring.

    `positions`: the epoch position of each record when they are not consecutive from start_position (a
    worker's shard of a slice under multi-worker training). `shards`: a packed.ShardReader to take the
    pictures from instead of the files at `paths` (records, order and augmentation stay the same).
    """
    if positions is None:
        positions = np.arange(start_position, start_position + len(paths), dtype=np.int64)
    elif len(positions) != len(paths):
        raise ValueError(f"{len(paths)} paths but {len(positions)} positions")
    settings = dict(
        output_size=(options.height, options.width), augmentation=options.augmentation,
        seeds=(options.seed, random_seed), batch_size=options.batch_size, max_image_pixels=options.max_image_pixels,
        tags=tags, num_parallel_calls=num_parallel_calls, jpeg_dct_scaling=jpeg_dct_scaling, mixup=options.mixup,
        fill=options.fill,
        shards=shards,
    )
    if options.data_service:
        from deepdanbooru.pipeline.service import service_batches

        return service_batches(_columns(paths, positions, tag_strings), _batching(**settings), options.batch_size,
                               options.data_service, options.deadline).with_options(_OPTIONS)
    return _build(_records(paths, positions, tag_strings), **settings)


def inference_dataset(paths, *, height, width, batch_size, max_image_pixels, tag_strings=None, tags=None,
                      num_parallel_calls=AUTOTUNE, jpeg_dct_scaling=True, fill=Fill(), shards=None):
    """Unaugmented batches (fit, centre, pad as `fill` says); labels only when tag_strings and tags are given.

    `shards`: a packed.ShardReader of pictures already fitted at (height, width) (the validation part) to read
    instead of the files at `paths`.
    """
    if (tag_strings is None) != (tags is None):
        raise ValueError("give both tag_strings and tags, or neither")
    positions = np.arange(len(paths), dtype=np.int64)
    records = _records(paths, positions, tag_strings)
    # Batches are padded to the batch size for one compiled shape: no batch needs more rows than there are
    # pictures (evaluate of 3 pictures at --batch-size 32 padded 29 rows; at 100,000,000 ran out of memory).
    batch_size = max(1, min(int(batch_size), len(paths)))
    return _build(
        records, output_size=(height, width), augmentation=None, seeds=(0, 0),
        batch_size=batch_size, max_image_pixels=max_image_pixels, tags=tags,
        num_parallel_calls=num_parallel_calls, jpeg_dct_scaling=jpeg_dct_scaling, fill=fill, shards=shards,
    )


def preprocess_for_inference(data, *, height, width, max_image_pixels, fill=Fill()):
    """Encoded bytes of one image -> float32 [height, width, 3] in [0, 1], exactly as inference_dataset does it.

    Raises tf.errors.InvalidArgumentError for undecodable or oversized images;
    use deepdanbooru.pipeline.badimages.diagnose_bytes for a readable reason.
    """
    single = _single_image_function((int(height), int(width)), int(max_image_pixels), fill)
    return single(tf.convert_to_tensor(data, tf.string))


@functools.lru_cache(maxsize=8)
def _single_image_function(output_size, max_image_pixels, fill):
    canvas = canvas_size(*output_size)
    box = (float(output_size[0]), float(output_size[1]))

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([], tf.string)])
    def preprocess(data):
        image, source = decode_for_box(data, max_image_pixels, box, fill=fill)
        content, size, zoom = fit_into_box(image, source, box, canvas)
        placed = place_on_canvas(content, canvas)
        return transform_batch(placed[None], size[None], zoom[None], tf.zeros([1, 4]), output_size, None, 1,
                               fill)[0]

    return preprocess
