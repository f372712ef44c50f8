"""export-bundle: a model in the layout of the WD tagger bundle, as today's tagger tools read it.

Those tools (kohya's tag_images_by_wd14_tagger, the WebUI tagger extensions,
SmilingWolf's wd-tagger space) read `selected_tags.csv`, composite alpha onto
white, pad the picture to a square with white, resize it (kohya: always to
448), flip it to BGR and feed float32 values 0-255 to `model.onnx`, reading
the scores by position: four ratings, then general tags, then characters
(bundle_rows). Our models want RGB in [0, 1] at their own size and answer in
tags.txt order, so the channel flip, the scaling, the resize to the model's
size and the row mapping are folded into the ONNX graph, and the thresholds
and metrics are measured on pictures prepared as the tools prepare them
(toolfeed), through that graph.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru.errors import ModelError, TagsError, UserError, file_field
from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic
from deepdanbooru.inference.bundle_rows import BundleRows, plan_rows
from deepdanbooru.project import categories as cat
from deepdanbooru.project.tags import tag_counts

MODEL_FILE = "model.onnx"
TAGS_FILE = "selected_tags.csv"
METRICS_FILE = "metrics.json"
PREPROCESS_FILE = "preprocess.json"
BUNDLE_FILES = (MODEL_FILE, TAGS_FILE, METRICS_FILE, PREPROCESS_FILE)
# Earlier bundles had their thresholds in a second CSV; a tool's local-folder loader takes one .csv only.
STALE_FILES = ("thresholds.csv",)
# The threshold columns come after WD's four, as animetimm's bundles carry theirs (the tools read by name).
TAG_COLUMNS = ("tag_id", "name", "category", "count", "best_threshold", "best_f1", "use")
DEFAULT_SIZE = 448  # kohya's tagger feeds 448 whatever the model
INPUT_NAME = "input"
OUTPUT_NAME = "predictions_sigmoid"  # the WD models' output name; some tools look it up by name


@dataclass(frozen=True)
class BundleReport:
    directory: Path
    rows: int
    max_abs_difference: float
    samples: int
    thresholds: dict
    dropped: dict


@dataclass(frozen=True)
class RowThresholds:
    """Per tag (tags.txt index): the threshold evaluate uses by default, its F1 and its use (own, fallback,
    withheld), and where they come from."""

    threshold: list
    f1: list
    use: list
    source: str


def model_row_thresholds(model_file, tags, measured_result, plan) -> RowThresholds:
    """The thresholds evaluate uses for this model by default: the *.thresholds.csv training wrote beside it.
    A model without one (trained without validation, or given alone) gets those derived, by the same rule,
    from the measurement on tool-fed pictures, and says so."""
    from deepdanbooru.inference.model_files import thresholds_beside
    from deepdanbooru.scoring.thresholds import FALLBACK, OWN, WITHHELD, read_threshold_rows

    n = len(tags)
    beside = thresholds_beside(Path(model_file))
    if beside is not None:
        rows = read_threshold_rows(beside)
        known = [rows.get(tag) for tag in tags]
        return RowThresholds([None if row is None else row.threshold for row in known],
                             [None if row is None else row.f1 for row in known],
                             [None if row is None else row.use or OWN for row in known], str(beside))
    per_tag = measured_result["per_tag"]
    threshold, f1, use = [None] * n, [None] * n, [None] * n
    for rank, position in enumerate(plan.measured):
        source = plan.rows[position].source
        threshold[source], f1[source] = float(per_tag["threshold"][rank]), float(per_tag["f1"][rank])
        use[source] = WITHHELD if per_tag["withheld"][rank] else OWN if per_tag["calibrated"][rank] else FALLBACK
    return RowThresholds(threshold, f1, use, "derived from this measurement (no *.thresholds.csv beside the model)")


def selected_tags_csv(plan: BundleRows, n_tags: int, counts, thresholds: RowThresholds) -> str:
    """WD's columns plus the threshold evaluate uses for the tag by default ("inf" for a withheld tag: never
    emitted), its F1 on validation and its use; empty on the constant rating rows."""
    from deepdanbooru.scoring.thresholds import WITHHELD

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TAG_COLUMNS)
    for position, row in enumerate(plan.rows):
        # Danbooru's tag ids are unknown here: the tags.txt line index (past its end for the constant rows).
        tag_id = n_tags + position if row.source is None else row.source
        count = 0 if row.source is None else counts[row.source]
        value = None if row.source is None else thresholds.threshold[row.source]
        if value is None:
            extra = ("", "", "")
        else:
            use = thresholds.use[row.source]
            f1 = thresholds.f1[row.source]
            extra = ("inf" if use == WITHHELD else repr(float(value)), "" if f1 is None else f"{f1:.6f}", use)
        writer.writerow((tag_id, row.name, row.category, count, *extra))
    return buffer.getvalue()


def category_thresholds(result: dict) -> dict:
    """The general and character thresholds of the bundle: each category's P=R point (docs/metrics.md)."""
    return {"general": result.get("general_pr_threshold", result["pr_threshold"]),
            "character": result.get("character_pr_threshold")}


def area_matrix(source: int, target: int) -> np.ndarray:
    """float32 [target, source]: output pixel i averages the input over [i, i + 1) * source / target (area)."""
    scale = source / target
    edges = np.arange(target + 1, dtype=np.float64) * scale
    pixels = np.arange(source, dtype=np.float64)
    overlap = np.minimum(edges[1:, None], pixels[None, :] + 1) - np.maximum(edges[:-1, None], pixels[None, :])
    return (np.clip(overlap, 0.0, None) / scale).astype(np.float32)


def area_resize(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """numpy [b, h, w, c] -> [b, height, width, c] with the in-graph resize's arithmetic."""
    rows, columns = area_matrix(images.shape[1], height), area_matrix(images.shape[2], width)
    return np.einsum("pw,bowc->bopc", columns, np.einsum("oh,bhwc->bowc", rows, images)).astype(np.float32)


def preprocess_description(size: int, model_size, plan: BundleRows, tags) -> dict:
    from deepdanbooru.inference.toolfeed import DESCRIPTION

    height, width = model_size
    resize = "none" if (height, width) == (size, size) else f"area average {size}x{size} -> {height}x{width}"
    return {
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "layout": "NHWC",
        "dtype": "float32",
        "height": size,
        "width": size,
        "channel_order": "BGR",
        "value_range": [0, 255],
        "expected_input": DESCRIPTION.format(size=size),
        "in_graph": ["BGR -> RGB", "/ 255", f"resize: {resize}", "the model",
                     "rows mapped to selected_tags.csv; a constant rating row scores 0"],
        "model_input_size": [height, width],
        "rows": {"rating": len(plan.positions(cat.RATING)), "general": len(plan.positions(cat.GENERAL)),
                 "character": len(plan.positions(cat.CHARACTER))},
        "ratings": plan.rating_sources(tags),
        "dropped": {label: len(names) for label, names in plan.dropped.items()},
        "tags": TAGS_FILE,
    }


def tool_body(model, sources, size: int):
    """(body, signature): body(run, image) takes BGR 0-255 NHWC at size x size to our RGB [0, 1] at the model's
    size, runs it through `run` (the model) and maps its outputs to the bundle's rows."""
    import tensorflow as tf

    height, width = (int(value) for value in model.input_shape[1:3])
    n_tags = int(model.output_shape[-1])
    # A constant row reads the zero column appended after the model's outputs.
    order = [n_tags if source is None else int(source) for source in sources]
    resize = (height, width) != (size, size)
    rows, columns = area_matrix(size, height), area_matrix(size, width)

    def body(run, image):
        rgb = tf.reverse(image, axis=[-1]) * (1.0 / 255.0)
        if resize:
            # Constants made inside the function: a tensor captured from outside would become an ONNX input.
            rgb = tf.einsum("oh,bhwc->bowc", tf.constant(rows), rgb)
            rgb = tf.einsum("pw,bowc->bopc", tf.constant(columns), rgb)
        scores = tf.cast(run(rgb), tf.float32)
        scores = tf.concat([scores, tf.zeros_like(scores[:, :1])], axis=1)
        return tf.gather(scores, tf.constant(order, dtype=tf.int32), axis=1)

    return body, (tf.TensorSpec((None, size, size, 3), tf.float32, name=INPUT_NAME),)


def tool_graph(model, body, signature):
    """tf.function of the bundle's graph (tool_body's body) around the Keras model, for measuring as the tools
    feed."""
    import tensorflow as tf

    return tf.function(lambda image: body(lambda x: model(x, training=False), image), input_signature=signature,
                       autograph=False)


def to_tool_input(images: np.ndarray) -> np.ndarray:
    """Our RGB [0, 1] images as the tools feed them: BGR, 0-255."""
    return np.ascontiguousarray(images[..., ::-1] * 255.0, dtype=np.float32)


def _check_destination(directory: Path, overwrite: bool) -> None:
    if directory.exists() and not directory.is_dir():
        raise UserError(file_field(directory, None, "is a file; give a folder for the bundle"))
    if not directory.parent.is_dir():
        raise UserError(file_field(directory.parent, None, "folder does not exist"))
    if not directory.is_dir():
        return
    present = sorted(path.name for path in directory.iterdir())
    if present and not overwrite:
        raise UserError(file_field(directory, None, f"already exists and holds {present[0]}; use --overwrite to "
                                                    "replace the bundle"))
    # A tool's local-folder loader wants exactly one .csv and one .onnx in the folder.
    ours = set(BUNDLE_FILES) | set(STALE_FILES)
    foreign = [name for name in present if name not in ours and name.lower().endswith((".csv", ".onnx"))]
    if foreign:
        raise UserError(file_field(directory / foreign[0], None, "is not a bundle file, and the tools want one "
                                                                 ".csv and one .onnx in the folder; move it away"))


def export_bundle(project_path, directory, *, model_path=None, split="validation", start_id=None, end_id=None,
                  size=DEFAULT_SIZE, overwrite=False, batch_size=32, allow_gpu=False, echo=print) -> BundleReport:
    """Convert the model with the tools' input and rows, measure it as they feed it, verify, write."""
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.inference.convert import FLOAT_TOLERANCE
    from deepdanbooru.inference.onnx_graph import require_onnx
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.inference.project_metrics import select_records
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.tags import load_tags

    directory = Path(directory)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UserError(f"--size: must be a positive number of pixels, got {size!r}")
    _check_destination(directory, overwrite)
    config = load_config(project_path)
    tags_path = config.project_dir / "tags.txt"
    tags = load_tags(tags_path)
    plan = plan_rows(tags, cat.tag_categories(tags, config.project_dir))
    if not plan.positions(cat.GENERAL) and not plan.positions(cat.CHARACTER):
        raise TagsError(file_field(tags_path, None, "has no general or character tag for the bundle"))
    files = resolve_model_files(project_path, model_path)
    counts = tag_counts(load_records(config.require_database(), config.minimum_tag_count,
                                  config.image_extensions).tag_strings, tags)
    records = select_records(config, split, start_id, end_id)  # a split without records fails before converting
    require_onnx("export-bundle")  # imports TensorFlow (tf2onnx does): after the checks that do not need it

    from deepdanbooru.inference.bundle_measure import measure_as_tools
    from deepdanbooru.inference.predict import configure_devices

    configure_devices(allow_gpu)
    content, function, difference, samples, model_size = _convert(files.model, tags_path, len(tags), plan, size,
                                                                  FLOAT_TOLERANCE, directory)
    # Once the model has converted: a model that does not fit gets its one line alone.
    echo(f"Model: {files.model} ({files.kind})")
    echo(f"Measuring {files.model} on the {split} split, pictures fed as the tools feed them ...")
    measured = measure_as_tools(function, records, tags, plan, size, batch_size, config, echo)
    result = measured.result
    thresholds = category_thresholds(result)
    description = preprocess_description(size, model_size, plan, tags)
    from deepdanbooru.scoring.metrics import write_metrics_json

    directory.mkdir(exist_ok=True)
    # The model last: a folder with model.onnx is complete.
    row_thresholds = model_row_thresholds(files.model, tags, result, plan)
    write_text_atomic(directory / TAGS_FILE, selected_tags_csv(plan, len(tags), counts, row_thresholds))
    write_metrics_json(directory / METRICS_FILE, result, {
        "model": str(files.model), "split": split, "start_id": start_id, "end_id": end_id,
        "records": len(records), "skipped": len(measured.skipped), "measured_as": description["expected_input"],
        "rows": [plan.rows[position].name for position in plan.measured], "constant_rows": plan.constant,
        # How the model was trained to see pictures, beside how the tools show them (measured_as).
        "project_padding": config.padding, "project_alpha": config.alpha,
        "category_thresholds": thresholds,
        # best_threshold in selected_tags.csv: what evaluate uses for the same model by default.
        "tag_thresholds": row_thresholds.source})
    write_text_atomic(directory / PREPROCESS_FILE, json.dumps(description, indent=2) + "\n")
    for name in STALE_FILES:
        (directory / name).unlink(missing_ok=True)
    write_bytes_atomic(directory / MODEL_FILE, content)
    _report(echo, directory, content, plan, tags, difference, samples, thresholds, split, result)
    echo(f"Per-tag thresholds in {TAGS_FILE} (best_threshold, use): {row_thresholds.source}, as evaluate uses them")
    return BundleReport(directory, len(plan.rows), difference, samples, thresholds,
                        {label: len(names) for label, names in plan.dropped.items()})


def _report(echo, directory, content, plan, tags, difference, samples, thresholds, split, result):
    rows = {label: len(plan.positions(number)) for label, number in
            (("rating", cat.RATING), ("general", cat.GENERAL), ("character", cat.CHARACTER))}
    echo(f"Wrote {directory} ({MODEL_FILE}: {len(content):,} bytes; rows: {rows['rating']} rating, "
         f"{rows['general']} general, {rows['character']} character)")
    sources = plan.rating_sources(tags)
    echo("Ratings: " + ", ".join(f"{name} <- {source or 'constant 0'}" for name, source in sources.items()))
    if plan.dropped:
        echo("Left out (the tools read by position): " + ", ".join(
            f"{len(names)} {label} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for label, names in plan.dropped.items()))
    echo(f"Largest absolute difference from Keras on {samples} sample inputs fed as BGR 0-255: {difference:.3g}")
    character = "n/a (no character tags)" if thresholds["character"] is None else f"{thresholds['character']:g}"
    echo(f"Thresholds (P=R on the {split} split, fed as the tools feed): general {thresholds['general']:g}, "
         f"character {character}; macro-F1 at 0.4: {result['macro_f1_040']:.4f}")


def _convert(model_file, tags_path, n_tags, plan, size, tolerance, directory):
    from deepdanbooru.models.files import load_model_file

    model = load_model_file(model_file)
    shape = tuple(model.input_shape)
    if len(shape) != 4 or shape[1] is None or shape[1] != shape[2] or shape[3] != 3:
        raise ModelError(file_field(model_file, None, f"input shape {shape}: the tools feed square RGB images "
                                                      "(image_height == image_width)"))
    if len(model.output_shape) != 2 or int(model.output_shape[-1]) != n_tags:
        raise ModelError(file_field(model_file, "output", f"has shape {tuple(model.output_shape)}, but "
                                                          f"{tags_path} lists {n_tags} tags"))
    return convert_for_tools(model, plan.sources, size, tolerance, directory / MODEL_FILE)


def convert_for_tools(model, sources, size, tolerance, destination):
    """(ONNX bytes, the traced function, largest difference from Keras, sample count, the model's input size):
    the model behind the tools' input and rows, run with onnxruntime on sample pictures fed as BGR 0-255 and
    compared with the Keras model on the same pictures resized in numpy, rows picked in Python."""
    from deepdanbooru.inference.convert import compare_outputs, float32_model, sample_inputs
    from deepdanbooru.inference.onnx_graph import model_graph_to_onnx, run_onnx

    height, width = int(model.input_shape[1]), int(model.input_shape[2])
    model = float32_model(model)
    body, signature = tool_body(model, sources, size)
    content = model_graph_to_onnx(model, body, signature, output_names=[OUTPUT_NAME])
    function = tool_graph(model, body, signature)
    images = sample_inputs(size, size)
    scores = np.asarray(model(area_resize(images, height, width), training=False), dtype=np.float32)
    expected = np.stack([np.zeros(len(images), np.float32) if source is None else scores[:, source]
                         for source in sources], axis=1)
    actual = run_onnx(content, to_tool_input(images))
    difference = compare_outputs(expected, actual, tolerance, destination)
    return content, function, difference, len(images), (height, width)
