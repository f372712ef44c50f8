"""The streaming input pipeline: one code path for training, validation and inference.

Importing this package imports TensorFlow. Everything per image runs as
TensorFlow ops inside tf.data, except for packed pictures (shards), which are
read, decoded and warped through numpy_function hops (packed.py, picturewarp.py).

Datasets
--------
TrainingInput(height, width, augmentation, seed, batch_size, max_image_pixels, mixup=None)
    frozen; TrainingInput.from_config(project_config) is the one mapping from project.json
    (the augmentation holds the geometry: rotation, scale, shift, flip, crop).
training_dataset(paths, tag_strings, tags, options: TrainingInput, *, random_seed, start_position,
                 positions=None, num_parallel_calls=tf.data.AUTOTUNE) -> tf.data.Dataset
    paths / tag_strings: the records of ONE slice, already in epoch order;
    element i has epoch position start_position + i (or positions[i] when
    given: a worker's shard under multi-worker training), and its augmentation is
    a pure function of (seed, random_seed, its position), whatever the
    process or the parallelism. Augmentation ranges are (low, high) or
    None/[] (disabled), as in ProjectConfig, and so are the flip, the crop and
    the mixup alpha (mixup pairs record i with record b-1-i of its batch). Yields dicts
        {"image": float32 [b, height, width, 3] in [0, 1],
         "label": float32 [b, len(tags)] multi-hot in tags order (mixed under mixup),
         "position": int64 [b]}
    b < batch_size at the end, and batches are refilled past dropped records,
    so the number of batches is ceil(usable / batch_size).

inference_dataset(paths, *, height, width, batch_size, max_image_pixels, tag_strings=None, tags=None,
                  num_parallel_calls=tf.data.AUTOTUNE) -> tf.data.Dataset
    Same dicts (with "label" only when tag_strings and tags are given);
    position i is paths[i]. Inference preprocessing: area-resize keeping
    aspect into (height, width), centre, replicate border pixels (or pad
    with white: fill), / 255. Use it for validation and evaluation too.

Fill(padding="border"|"white", alpha="drop"|"white"), frozen; Fill.from_config(config)
    The one decision of what surrounds a picture (in the warp, so also what
    rotations and shifts uncover in training) and whether PNG / WebP
    transparency is composited onto white; the defaults are DeepDanbooru's.
    TrainingInput.fill, inference_dataset(fill=), preprocess_for_inference(fill=).

preprocess_for_inference(data, *, height, width, max_image_pixels) -> float32 [height, width, 3]
    The inference preprocessing of one encoded image (bytes or a scalar string
    tensor), for single-file tools (evaluate, grad-cam). Raises
    tf.errors.InvalidArgumentError on a bad image; diagnose_bytes(data,
    max_image_pixels) then gives the reason.

No silent drops
---------------
Records that cannot be read or decoded (or whose header declares more than
max_image_pixels pixels, or an unknown format) are left out of the batches.
BadImageTracker finds and explains them:

    tracker = BadImageTracker(ProjectPaths(p).bad_images, epoch_paths,
                              max_image_pixels=config.max_image_pixels, context=f"epoch {epoch}")
    for batch in dataset:
        tracker.observe(batch["position"].numpy())
        ...
    bad = tracker.finish(start_position, len(slice_paths))   # diagnoses and logs the gaps

    epoch_paths[position] must be the record at that position. Log lines
    appended to logs/bad_images.txt (directories created):
        <context>\\t<position>\\t<path>\\t<reason>
    Attributes: seen (records closed by finish), bad, used, bad_fraction,
    reasons (Counter of reason kinds), last_bad [(position, path, reason)]
    of the latest finish(). The trainer decides what fraction is too much
    (project key max_bad_image_fraction) and what to do when a slice yields
    no batch.

diagnose(path, max_image_pixels) -> str; diagnose_bytes(data, max_image_pixels) -> str | None
    Reasons start with one of: "file not found", "cannot be read", "empty
    file (0 bytes)", "not an image (unrecognised file signature)",
    "oversized", "truncated", "cannot be decoded".

Building blocks
---------------
decode_image_bytes(data, max_image_pixels) -> uint8 [h, w, 3]
    Graph-mode and eager. JPEG (baseline, progressive, grayscale, CMYK), PNG
    (RGB, RGBA, palette, gray, gray+alpha, 16-bit), GIF (first frame), BMP,
    WebP (lossy, lossless, alpha, animated: first frame). The format is
    sniffed from the bytes; the size declared by the header (PNG IHDR, BMP
    header, WebP VP8/VP8L/VP8X canvas x frames, JPEG frame header via
    libjpeg, GIF canvas over all frame descriptors x frames, found by an
    in-graph block walk) is checked against max_image_pixels before any pixel
    is decoded. Animations count every frame because the decoders allocate
    every frame.
image_header(data) -> (format index, int64 [height, width, frames]); FORMAT_NAMES.
tag_table(tags), multi_hot(tag_strings, table, n_tags): the label ops.
Augmentation, warp_parameters, warp_batch, transform_batch: the geometry
    (transform.py). Per record the image is area-resized to fit
    (height * s_max, width * s_max) (smaller images are not enlarged there)
    and padded onto a fixed canvas; per batch one compiled XLA kernel draws
    the warp from four stateless uniforms keyed by (seed, random_seed,
    position) (four more, from a second stream, when the flip or the crop is
    on; s_max then includes the crop's zoom) and samples bilinearly with clamped coordinates (border
    replication). Pixel centres are at integer coordinates and the centre of
    an n-pixel axis is pixel floor(n / 2), so the identity warp copies pixels
    exactly; a positive angle turns the picture counter-clockwise as
    displayed; a positive shift moves it right / down. Images smaller than
    the box are enlarged by the warp, bilinearly.
"""

from deepdanbooru.pipeline.badimages import BadImageTracker, diagnose, diagnose_bytes
from deepdanbooru.pipeline.dataset import TrainingInput, inference_dataset, preprocess_for_inference, training_dataset
from deepdanbooru.pipeline.decode import decode_image_bytes
from deepdanbooru.pipeline.fill import Fill
from deepdanbooru.pipeline.header import FORMAT_NAMES, image_header
from deepdanbooru.pipeline.labels import multi_hot, tag_table
from deepdanbooru.pipeline.transform import Augmentation, transform_batch, warp_batch, warp_parameters

__all__ = [
    "Augmentation",
    "BadImageTracker",
    "FORMAT_NAMES",
    "Fill",
    "TrainingInput",
    "decode_image_bytes",
    "diagnose",
    "diagnose_bytes",
    "image_header",
    "inference_dataset",
    "multi_hot",
    "preprocess_for_inference",
    "tag_table",
    "training_dataset",
    "transform_batch",
    "warp_batch",
    "warp_parameters",
]
