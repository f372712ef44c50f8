"""check-bundle: does a bundle answer as evaluate does?

Runs BUNDLE/model.onnx with onnxruntime on pictures prepared as the WD tagger tools prepare them (toolfeed: alpha
on white, a white square, resized to the bundle's input, BGR 0-255), reads the rows by selected_tags.csv's names
and thresholds, and sets them beside `evaluate` with the same model on the same pictures (the project's own
preprocessing, the thresholds evaluate uses by default). Reports how many pictures get the same tags, the
largest score difference and, for each picture that differs, why.

Where the two roads can differ for a sound bundle:
- a picture that is not square: the tools pad it to a white square, then resize; evaluate fits it to the
  model's size, then pads (repeating the border, or with white under `padding: white`);
- a picture resized twice: the tools resize to the bundle's input (448 for kohya's tagger), the graph then to
  the model's own size; evaluate resizes once;
- a threshold in selected_tags.csv that is not evaluate's (a bundle exported before the model's thresholds
  changed).
A bundle whose rows do not match its outputs (shifted, reordered, of another model) differs on every picture.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deepdanbooru import exitcodes
from deepdanbooru.errors import ModelError, UserError, file_field
from deepdanbooru.inference.output import print_err

DEFAULT_TOLERANCE = 0.05
SHOWN = 10  # differing pictures named one a line; the rest are counted


class BundleDisagrees(UserError):
    """The bundle's scores or tags differ from evaluate's by more than the tolerance."""

    exit_code = exitcodes.FAILED


@dataclass(frozen=True)
class BundleRow:
    name: str
    source: int | None  # index in the model's tags; None: a constant row
    threshold: float | None  # selected_tags.csv's best_threshold (inf: withheld); None: none given


@dataclass
class CheckReport:
    pictures: int = 0
    same_tags: int = 0
    largest_difference: float = 0.0
    largest_where: tuple = ()  # (picture, tag)
    threshold_mismatches: list = field(default_factory=list)  # (tag, bundle, evaluate)
    differing: list = field(default_factory=list)  # (picture, only on the bundle, only from evaluate, reason)
    skipped: list = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.tolerance_ok and not self.threshold_mismatches

    tolerance_ok: bool = True


def read_bundle_rows(bundle: Path, tags) -> list[BundleRow]:
    """selected_tags.csv's rows mapped to the model's tags; a rating row through preprocess.json's sources."""
    from deepdanbooru.inference.bundle import PREPROCESS_FILE, TAGS_FILE

    path = bundle / TAGS_FILE
    try:
        with open(path, newline="", encoding="utf-8") as stream:
            rows = list(csv.DictReader(stream))
    except FileNotFoundError:
        raise UserError(file_field(path, None, "not found: BUNDLE must be a folder export-bundle wrote")) from None
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise UserError(file_field(path, None, f"cannot be read: {error}")) from None
    if not rows or "name" not in rows[0]:
        raise UserError(file_field(path, "header", "needs a name column (WD's tag_id,name,category,count)"))
    ratings = {}
    preprocess = bundle / PREPROCESS_FILE
    if preprocess.is_file():
        try:
            ratings = json.loads(preprocess.read_text(encoding="utf-8")).get("ratings", {}) or {}
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise UserError(file_field(preprocess, None, f"cannot be read: {error}")) from None
    index = {tag: position for position, tag in enumerate(tags)}
    out = []
    for line, row in enumerate(rows, start=2):
        name = row.get("name") or ""
        if name in ratings:
            source = ratings[name]
            position = None if source is None else index.get(source)
        else:
            position = index.get(name)
            if position is None:
                raise UserError(file_field(path, f"line {line}", f"tag {name!r} is not one of the model's tags "
                                                                 "(a bundle of another model?)"))
        text = (row.get("best_threshold") or "").strip()
        try:
            threshold = float(text) if text else None
        except ValueError:
            raise UserError(file_field(path, f"line {line}", f"best_threshold {text!r} is not a number")) from None
        out.append(BundleRow(name, position, threshold))
    return out


def _session(bundle: Path):
    from deepdanbooru.inference.bundle import MODEL_FILE
    from deepdanbooru.inference.onnx_graph import require_onnx

    path = bundle / MODEL_FILE
    if not path.is_file():
        raise UserError(file_field(path, None, "not found: BUNDLE must be a folder export-bundle wrote"))
    require_onnx("check-bundle")
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types for a file that is not a model
        raise ModelError(file_field(path, None, f"onnxruntime cannot open it: {str(error).splitlines()[0]}")) from None
    inputs = session.get_inputs()
    shape = inputs[0].shape if len(inputs) == 1 else None
    if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or shape[1] != shape[2]:
        raise ModelError(file_field(path, None, f"has inputs {[(i.name, i.shape) for i in inputs]}; a bundle has "
                                                "one square NHWC picture input"))
    return session, inputs[0].name, int(shape[1])


def _why(path: Path, size: int, model_size: int, crossing: list, fill_name: str) -> str:
    from PIL import Image

    reasons = []
    try:
        with Image.open(path) as image:
            width, height = image.size
    except (OSError, ValueError):
        width = height = None
    if width is not None and width != height:
        reasons.append(f"{width}x{height} is not square: the tools pad it to a white square, then resize; "
                       f"evaluate fits it, then pads ({fill_name})")
    if size != model_size:
        reasons.append(f"resized twice on the bundle's road ({size} px, then {model_size} px in the graph)")
    if crossing:
        reasons.append("scores (bundle / evaluate) at the threshold: " + ", ".join(crossing[:3]))
    return "; ".join(reasons) or "scores differ beyond the tolerance (rows that do not match the outputs?)"


def check_bundle(bundle, targets, *, project_path=None, model_path=None, tags_path=None,
                 tolerance=DEFAULT_TOLERANCE, batch_size=32, allow_gpu=False, echo=print,
                 echo_err=print_err) -> CheckReport:
    from deepdanbooru.inference.model_files import choose_thresholds, model_tags, resolve_model_files
    from deepdanbooru.inference.output import threshold_vector
    from deepdanbooru.inference.targets import collect_targets

    bundle = Path(bundle)
    if not bundle.is_dir():
        raise UserError(file_field(bundle, None, "is not a folder: give the folder export-bundle wrote"))
    if not (isinstance(tolerance, float) and 0.0 <= tolerance <= 1.0):
        raise UserError(f"--tolerance: must be in [0, 1], got {tolerance}")
    missing: list = []
    paths = collect_targets(targets, allow_folder=True, missing=missing)
    if not paths:
        raise UserError(file_field(missing[0][0], None, missing[0][1]) if missing else
                        f"{', '.join(map(str, targets))}: no image files found")
    files = resolve_model_files(project_path, model_path, tags_path)
    tags = model_tags(files)
    rows = read_bundle_rows(bundle, tags)
    choice = choose_thresholds(files.model, None, None)
    thresholds = threshold_vector(tags, choice.default, choice.csv)
    session, input_name, size = _session(bundle)

    from deepdanbooru.inference.predict import configure_devices, load_tagger
    from deepdanbooru.inference.toolfeed import tool_batches

    from deepdanbooru.inference.evaluate import TaggingOptions

    configure_devices(allow_gpu)
    # As evaluate runs without options: transparency onto white, the project's padding.
    tagger = load_tagger(files, tags, alpha=TaggingOptions.alpha, padding=TaggingOptions.padding)
    echo(f"Model: {files.model} ({files.kind}); thresholds: {choice.description}")
    echo(f"Bundle: {bundle} ({len(rows)} rows, input {size}x{size}), fed as the tools feed it; evaluate feeds "
         f"{tagger.height}x{tagger.width} with the project's preprocessing")
    report = CheckReport(skipped=list(missing))
    mapped = [(position, row) for position, row in enumerate(rows) if row.source is not None]
    for _, row in mapped:
        ours = float(thresholds[row.source])
        theirs = math.inf if row.threshold is None else row.threshold
        if not (ours == theirs or abs(ours - theirs) <= 1e-6):
            report.threshold_mismatches.append((row.name, row.threshold, ours))

    def skip(index, reason):
        report.skipped.append((paths[index], reason))

    evaluated = {index: scores for index, scores in tagger.predict(paths, batch_size, skip)}
    fill_name = "with white" if tagger.fill.padding == "white" else "repeating the border"
    for indices, images, skipped in tool_batches(paths, size, batch_size, files.max_image_pixels):
        for index, reason in skipped:
            if index in evaluated:
                report.skipped.append((paths[index], f"the tools' road: {reason}"))
        if not indices:
            continue
        answers = np.asarray(session.run(None, {input_name: images})[0], dtype=np.float32)
        output_width = answers.shape[1]
        if output_width != len(rows):
            raise BundleDisagrees(file_field(bundle / "model.onnx", None, f"answers {output_width} rows, its "
                                                                          f"selected_tags.csv lists {len(rows)}"))
        for index, answer in zip(indices, answers):
            if index not in evaluated:
                continue
            ours = evaluated[index]
            report.pictures += 1
            differences = [(abs(float(answer[position]) - float(ours[row.source])), row.name)
                           for position, row in mapped]
            worst = max(differences, default=(0.0, ""))
            if worst[0] > report.largest_difference or not report.largest_where:
                report.largest_difference, report.largest_where = worst[0], (paths[index], worst[1])
            bundle_tags = {row.name for position, row in mapped
                           if row.threshold is not None and answer[position] >= row.threshold}
            evaluate_tags = {row.name for position, row in mapped if ours[row.source] >= thresholds[row.source]}
            if bundle_tags == evaluate_tags:
                report.same_tags += 1
                continue
            crossing = [f"{row.name} {float(answer[position]):.3f} / {float(ours[row.source]):.3f} at "
                    f"{float(thresholds[row.source]):.3f}" for position, row in mapped
                    if (row.name in bundle_tags) != (row.name in evaluate_tags)]
            report.differing.append((paths[index], sorted(bundle_tags - evaluate_tags),
                                     sorted(evaluate_tags - bundle_tags),
                                     _why(paths[index], size, tagger.height, crossing, fill_name)))
    report.tolerance_ok = report.largest_difference <= tolerance
    _print(report, tolerance, echo, echo_err)
    if report.pictures == 0:
        raise UserError("no picture could be read on both roads; see the reasons above")
    if not report.agrees:
        why = []
        if not report.tolerance_ok:
            why.append(f"scores differ by up to {report.largest_difference:.4f}, more than --tolerance {tolerance:g}")
        if report.threshold_mismatches:
            why.append(f"{len(report.threshold_mismatches)} thresholds in selected_tags.csv are not evaluate's")
        raise BundleDisagrees(f"{bundle} does not answer as evaluate does: {'; '.join(why)}")
    return report


def _print(report: CheckReport, tolerance: float, echo, echo_err) -> None:
    for path, reason in report.skipped:
        echo_err(f"skipped {path}: {reason}")
    picture, tag = report.largest_where or ("-", "-")
    echo(f"Same tags on {report.same_tags} of {report.pictures} pictures; largest score difference "
         f"{report.largest_difference:.4f} ({tag} on {picture}); tolerance {tolerance:g}")
    for name, bundle_value, ours in report.threshold_mismatches[:SHOWN]:
        echo(f"threshold of {name}: {bundle_value} in selected_tags.csv, {ours:g} in evaluate")
    for path, only_bundle, only_evaluate, reason in report.differing[:SHOWN]:
        echo(f"differs {path}: bundle only [{', '.join(only_bundle)}], evaluate only [{', '.join(only_evaluate)}]: "
             f"{reason}")
    if len(report.differing) > SHOWN:
        echo(f"... and {len(report.differing) - SHOWN} more pictures differ")
