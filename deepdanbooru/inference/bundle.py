"""export-bundle: a model in the layout of the WD tagger bundle that today's tagger tools load.

Those tools (kohya's tag_images_by_wd14_tagger, the WebUI tagger extensions,
ONNX tagger front-ends) read `selected_tags.csv`, pad an image to a square
with white, resize it to the model's size, flip it to BGR and feed float32
values in 0-255 to `model.onnx`, whose outputs are in the CSV's row order.
Our models want RGB in [0, 1] and outputs in tags.txt order, so the channel
flip, the scaling and the reordering are folded into the ONNX graph; the
padding cannot be (the tool has done it before the model sees the image):
docs/evaluation.md gives its measured cost.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru.errors import ModelError, UserError, file_field
from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic
from deepdanbooru.project import categories as cat
from deepdanbooru.project.tags import tag_counts

MODEL_FILE = "model.onnx"
TAGS_FILE = "selected_tags.csv"
THRESHOLDS_FILE = "thresholds.csv"
METRICS_FILE = "metrics.json"
PREPROCESS_FILE = "preprocess.json"
BUNDLE_FILES = (MODEL_FILE, TAGS_FILE, THRESHOLDS_FILE, METRICS_FILE, PREPROCESS_FILE)
TAG_COLUMNS = ("tag_id", "name", "category", "count")
# The bundle's row order: ratings, general, character (what the tools expect), then any other category.
CATEGORY_ORDER = (cat.RATING, cat.GENERAL, cat.CHARACTER, cat.COPYRIGHT, cat.ARTIST, cat.META)
INPUT_NAME = "input"
OUTPUT_NAME = "predictions_sigmoid"  # the WD models' output name; some tools look it up by name


@dataclass(frozen=True)
class BundleReport:
    directory: Path
    tags: int
    max_abs_difference: float
    samples: int
    thresholds: dict


def bundle_order(categories) -> list[int]:
    """tags.txt indices in the bundle's row order; a tag of unknown category counts as general."""
    known = [cat.GENERAL if value is None else value for value in categories]
    rank = {category: position for position, category in enumerate(CATEGORY_ORDER)}
    return sorted(range(len(known)), key=lambda index: (rank.get(known[index], len(rank)), index))


def selected_tags_csv(tags, categories, counts, order) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TAG_COLUMNS)
    for index in order:
        category = cat.GENERAL if categories[index] is None else categories[index]
        # Danbooru's tag ids are unknown here; the tags.txt line index keeps the column unique and stable.
        writer.writerow((index, tags[index], category, counts[index]))
    return buffer.getvalue()


def category_thresholds(result: dict) -> dict:
    """The general and character thresholds of the bundle: each category's P=R point (docs/metrics.md);
    without categories.json the overall P=R point serves as the general one."""
    general = result.get("general_pr_threshold", result["pr_threshold"])
    return {"general": general, "character": result.get("character_pr_threshold")}


def preprocess_description(height: int, width: int) -> dict:
    return {
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "layout": "NHWC",
        "dtype": "float32",
        "height": height,
        "width": width,
        "channel_order": "BGR",
        "value_range": [0, 255],
        "padding": "pad to a square with white (255, 255, 255), image centred, before resizing",
        "resize": f"area (shrinking) to {height}x{width}",
        "in_graph": "BGR -> RGB, / 255, outputs reordered to selected_tags.csv",
        "tags": TAGS_FILE,
    }


def tool_graph(model, order):
    """tf.function: BGR 0-255 NHWC -> our RGB [0, 1] -> model -> outputs in bundle order."""
    import tensorflow as tf

    height, width = model.input_shape[1:3]
    order = [int(index) for index in order]

    def predict(image):
        rgb = tf.reverse(image, axis=[-1]) * (1.0 / 255.0)
        scores = tf.cast(model(rgb, training=False), tf.float32)
        # Made inside the function: a tensor captured from outside would become an ONNX input.
        return tf.gather(scores, tf.constant(order, dtype=tf.int32), axis=1)

    signature = (tf.TensorSpec((None, height, width, 3), tf.float32, name=INPUT_NAME),)
    return tf.function(predict, input_signature=signature, autograph=False), signature


def to_tool_input(images: np.ndarray) -> np.ndarray:
    """Our RGB [0, 1] images as the tools feed them: BGR, 0-255."""
    return np.ascontiguousarray(images[..., ::-1] * 255.0, dtype=np.float32)


def _check_destination(directory: Path, overwrite: bool) -> None:
    if directory.exists() and not directory.is_dir():
        raise UserError(file_field(directory, None, "is a file; give a folder for the bundle"))
    if not directory.parent.is_dir():
        raise UserError(file_field(directory.parent, None, "folder does not exist"))
    if overwrite or not directory.is_dir():
        return
    present = [name for name in BUNDLE_FILES if (directory / name).exists()]
    if present:
        raise UserError(file_field(directory / present[0], None,
                                   "already exists; use --overwrite to replace the bundle"))


def export_bundle(project_path, directory, *, model_path=None, split="validation", start_id=None, end_id=None,
                  overwrite=False, batch_size=32, allow_gpu=False, echo=print) -> BundleReport:
    """Measure the model on the project's split, convert it with the tools' input convention, verify, write."""
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.inference.convert import FLOAT_TOLERANCE, require_onnx
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.tags import load_tags

    directory = Path(directory)
    _check_destination(directory, overwrite)
    config = load_config(project_path)
    tags = load_tags(config.project_dir / "tags.txt")
    categories = cat.tag_categories(tags, config.project_dir)
    files = resolve_model_files(project_path, model_path)
    records = load_records(config.require_database(), config.minimum_tag_count, config.image_extensions)
    counts = tag_counts(records.tag_strings, tags)
    order = bundle_order(categories)

    from deepdanbooru.inference.project_metrics import project_metrics, select_records

    select_records(config, split, start_id, end_id)  # a split without records fails before the conversion
    require_onnx("export-bundle")  # imports TensorFlow (tf2onnx does): after the checks that do not need it
    content, difference, samples, (height, width) = _convert(files.model, order, FLOAT_TOLERANCE, directory)
    echo(f"Measuring {files.model} on the {split} split ...")
    summary = project_metrics(project_path, model_path=model_path, split=split, start_id=start_id, end_id=end_id,
                              batch_size=batch_size, allow_gpu=allow_gpu, echo=lambda *_: None)

    result = summary.result
    thresholds = category_thresholds(result)
    reordered = {**result, "per_tag": {key: np.asarray(values)[order] for key, values in result["per_tag"].items()}}
    from deepdanbooru.scoring.metrics import write_metrics_json, write_thresholds_csv

    directory.mkdir(exist_ok=True)
    # The model last: a folder with model.onnx is complete.
    write_text_atomic(directory / TAGS_FILE, selected_tags_csv(tags, categories, counts, order))
    write_thresholds_csv(directory / THRESHOLDS_FILE, [tags[index] for index in order], reordered)
    write_metrics_json(directory / METRICS_FILE, result, {
        "model": str(files.model), "split": split, "start_id": start_id, "end_id": end_id,
        "records": summary.records, "skipped": len(summary.skipped), "category_thresholds": thresholds})
    write_text_atomic(directory / PREPROCESS_FILE,
                      json.dumps(preprocess_description(height, width), indent=2) + "\n")
    write_bytes_atomic(directory / MODEL_FILE, content)
    report = BundleReport(directory, len(tags), difference, samples, thresholds)
    character = "n/a (no character tags)" if thresholds["character"] is None else f"{thresholds['character']:g}"
    echo(f"Wrote {directory} ({MODEL_FILE}: {len(content):,} bytes, {len(tags)} tags)")
    echo(f"Largest absolute difference from Keras on {samples} sample inputs fed as BGR 0-255: {difference:.3g}")
    echo(f"Thresholds (P=R on the {split} split): general {thresholds['general']:g}, character {character}; "
         f"macro-F1 at 0.4: {result['macro_f1_040']:.4f}")
    return report


def _convert(model_file, order, tolerance, directory):
    from deepdanbooru.inference.convert import compare_outputs, float32_model, function_to_onnx, run_onnx, \
        sample_inputs
    from deepdanbooru.models.files import load_model_file

    model = load_model_file(model_file)
    shape = tuple(model.input_shape)
    if len(shape) != 4 or shape[1] is None or shape[1] != shape[2] or shape[3] != 3:
        raise ModelError(file_field(model_file, None, f"input shape {shape}: the tools feed square RGB images "
                                                      "of a fixed size (image_height == image_width)"))
    if int(model.output_shape[-1]) != len(order):
        raise ModelError(file_field(model_file, None, f"{model.output_shape[-1]} outputs for {len(order)} tags"))
    height, width = shape[1], shape[2]
    model = float32_model(model)
    function, signature = tool_graph(model, order)
    content = function_to_onnx(function, signature, output_names=[OUTPUT_NAME])
    images = sample_inputs(height, width)
    expected = np.asarray(model(images, training=False), dtype=np.float32)[:, order]
    actual = run_onnx(content, to_tool_input(images))
    return content, compare_outputs(expected, actual, tolerance, directory / MODEL_FILE), len(images), (height, width)
