"""evaluate-project --metrics: a saved model's validation metrics over a project's records.

The records, preprocessing, loss and metrics are the trainer's own
(scoring.split, pipeline.inference_dataset, scoring.scorer), so the
figures of an export match those in its `*.metrics.json` and let a user
compare exports, or any model, on the same images.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.dataset.records import Records, load_records
from deepdanbooru.errors import ConfigError, DatasetError, ModelError, UserError, file_field
from deepdanbooru.inference.model_files import resolve_model_files
from deepdanbooru.inference.output import print_err
from deepdanbooru.project.categories import category_indices, tag_categories
from deepdanbooru.project.config import load_config
from deepdanbooru.project.tags import load_tags

SPLITS = ("validation", "all")

# Printed first, in this order; the remaining scalars follow.
_LEAD = ("loss", "micro_precision", "micro_recall", "micro_f1", "macro_precision", "macro_recall", "macro_f1",
         "map", "mcc", "global_threshold", "global_threshold_precision", "global_threshold_recall",
         "global_threshold_f1", "calibrated_tags", "calibrated_macro_f1", "fallback_tags", "calibrated_tags_f1",
         "calibrated_tags_f1_at_threshold", "fallback_tags_f1", "fallback_tags_f1_at_threshold", "pr_threshold",
         "pr_f1", "macro_f1_040", "macro_mcc_040")


def coverage_lines(scalars: dict) -> list[str]:
    """Which tags the macro figures average over and at which thresholds: they differ, and without this
    calibrated_macro_f1 below macro_f1 reads as calibration making things worse."""
    if "fallback_tags" not in scalars:
        return []
    tags, threshold = scalars["tags_with_positives"], scalars["threshold"]

    def shown(name):
        return group_mean_text(name, scalars)

    return [
        f"macro_f1, map: the {tags} tags with a positive in the split, macro_f1 each at {threshold:g}",
        f"calibrated_macro_f1: the same {tags}: {scalars['calibrated_tags']} at their own threshold "
        f"(>= {scalars['min_support']} positives; calibrated_tags_f1 {shown('calibrated_tags_f1')} there, "
        f"{shown('calibrated_tags_f1_at_threshold')} at {threshold:g}), {scalars['fallback_tags']} at "
        f"global_threshold {scalars['global_threshold']:g} (fallback_tags_f1 {shown('fallback_tags_f1')} there, "
        f"{shown('fallback_tags_f1_at_threshold')} at {threshold:g})",
        f"pr_f1: the same {tags}, all at pr_threshold {scalars['pr_threshold']:g}",
    ]


# A mean over a group of tags that may be empty: its 0 then measures nothing.
_GROUP_MEANS = {"calibrated_tags_f1": "calibrated_tags", "calibrated_tags_f1_at_threshold": "calibrated_tags",
                "fallback_tags_f1": "fallback_tags", "fallback_tags_f1_at_threshold": "fallback_tags"}


def group_mean_text(name: str, scalars: dict) -> str:
    group = _GROUP_MEANS.get(name)
    if group is not None and scalars.get(group) == 0:
        return f"- (no {group.replace('_', ' ')[:-1]})"
    return _format(scalars[name])


@dataclass
class MetricsSummary:
    model: Path
    split: str
    records: int
    result: dict
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def metrics(self) -> dict:
        return {key: value for key, value in self.result.items() if key != "per_tag"}


def select_records(config, split: str, start_id: int | None = None, end_id: int | None = None) -> Records:
    """The project's eligible records of `split`, limited to start_id <= id <= end_id."""
    from deepdanbooru.project.paths import ProjectPaths
    from deepdanbooru.runstate.state import read_state_json
    from deepdanbooru.scoring.split import split_for_run

    if split not in SPLITS:
        raise UserError(f"--split: must be one of {', '.join(SPLITS)}, got {split!r}")
    if start_id is not None and end_id is not None and start_id > end_id:
        raise UserError(f"--start-id {start_id} is greater than --end-id {end_id}")
    database = config.require_database()
    records = load_records(database, config.minimum_tag_count, config.image_extensions)
    if split == "validation":
        if config.validation_fraction <= 0:
            raise ConfigError(file_field(
                config.config_path, "validation_fraction",
                "is 0, so the project has no validation split; use --split all (with --start-id/--end-id "
                "to pick records), or set the fraction the model was trained with"))
        # The trainer's split, also for a run that keeps its split by post id.
        _, records, _ = split_for_run(records, config.validation_fraction, config.seed,
                                      read_state_json(ProjectPaths(config.project_dir).checkpoints)[0])
    low = start_id if start_id is not None else -(1 << 63)
    high = end_id if end_id is not None else (1 << 63) - 1
    chosen = [index for index, post_id in enumerate(records.ids) if low <= post_id <= high]
    if not chosen:
        where = f"the validation split (validation_fraction {config.validation_fraction:g})" \
            if split == "validation" else "the eligible posts"
        bounds = [f"id >= {start_id}"] * (start_id is not None) + [f"id <= {end_id}"] * (end_id is not None)
        limits = f" with {' and '.join(bounds)}" if bounds else ""
        raise DatasetError(file_field(database, "posts", f"no record in {where}{limits}"))
    return records if len(chosen) == len(records) else records.subset(chosen)


# One row per tag in --format json's per_tag and --format csv, in this order. f1, precision and recall are at the
# tag's own threshold (calibrated) or at global_threshold (too few positives to calibrate); f1_at_threshold is
# at the working threshold (--threshold, the project's validation_threshold), as the `f1` of the scalars.
PER_TAG_FIELDS = ("tag", "positives", "ap", "f1", "threshold", "calibrated", "withheld", "precision", "recall",
                  "f1_at_threshold", "source_ap")
SOURCE_AP_FILE = "source_tag_ap.json"  # written by a fresh train-project --source-model before its first step


@dataclass(frozen=True)
class SourceFigures:
    """The source's AP per tag before the first step (logs/source_tag_ap.json), when it measured these posts."""
    file: Path
    source_model: str | None
    ap: dict  # tag -> AP or None; only the tags the source knows
    same_posts: bool
    detail: str

    def as_json(self) -> dict:
        return {"file": str(self.file), "source_model": self.source_model, "same_posts": self.same_posts,
                "detail": self.detail}


def read_source_figures(project_dir: Path, split: str, start_id, end_id, records: int) -> SourceFigures | None:
    """None for a project that did not start from --source-model. The file holds the source's AP on the
    validation split: used only when these are the same posts (the validation split, unlimited, as many)."""
    path = Path(project_dir) / "logs" / SOURCE_AP_FILE
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        ap = payload["ap"]
        measured = payload.get("validation_records")
        if not isinstance(ap, dict) or not all(v is None or isinstance(v, (int, float)) for v in ap.values()):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        raise UserError(file_field(path, None, "cannot be read as the source's AP per tag (an object with "
                                               "\"ap\": {tag: number or null})")) from None
    source = payload.get("source_model") if isinstance(payload.get("source_model"), str) else None
    if split != "validation" or start_id is not None or end_id is not None:
        return SourceFigures(path, source, ap, False, (
            "the source was measured on the validation split, not on these posts: source_ap is null; measure "
            "the validation split without --start-id/--end-id to compare"))
    if measured != records:
        return SourceFigures(path, source, ap, False, (
            f"the source was measured on {measured} validation records, these are {records} (the split or the "
            "pictures changed since): source_ap is null"))
    return SourceFigures(path, source, ap, True, (
        f"the source's AP on these {records} validation records before the first step; null for a tag it "
        "did not know or without a positive"))


def per_tag_rows(tags, result: dict, source: SourceFigures | None) -> list[dict]:
    """One dict per tag (PER_TAG_FIELDS); a figure that measures nothing (no positive in the split) is None."""
    from deepdanbooru.scoring.thresholds import f1_scores

    per_tag = result["per_tag"]
    at_threshold = f1_scores(per_tag["tp"], per_tag["fp"], per_tag["fn"])

    def number(value, digits=6):
        value = float(value)
        return round(value, digits) if math.isfinite(value) else None

    rows = []
    for index, tag in enumerate(tags):
        positives = int(per_tag["support"][index])
        measured = positives > 0
        known = source is not None and source.same_posts and source.ap.get(tag) is not None
        rows.append({
            "tag": tag,
            "positives": positives,
            "ap": number(per_tag["ap"][index]) if measured else None,
            "f1": number(per_tag["f1"][index]) if measured else None,
            "threshold": number(per_tag["threshold"][index]),
            "calibrated": bool(per_tag["calibrated"][index]),
            "withheld": bool(per_tag["withheld"][index]),
            "precision": number(per_tag["precision"][index]) if measured else None,
            "recall": number(per_tag["recall"][index]) if measured else None,
            "f1_at_threshold": number(at_threshold[index]) if measured else None,
            "source_ap": number(source.ap[tag]) if known else None,
        })
    return rows


def per_tag_csv(rows: list[dict]) -> str:
    """The per_tag rows as CSV with a header; an empty cell where the JSON has null."""
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(PER_TAG_FIELDS)
    for row in rows:
        writer.writerow("" if row[name] is None else ("true" if row[name] is True else "false")
                        if isinstance(row[name], bool) else row[name] for name in PER_TAG_FIELDS)
    return stream.getvalue()


def _format(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def project_metrics(project_path, *, model_path=None, split="validation", start_id=None, end_id=None,
                    threshold=None, batch_size=32, allow_gpu=False, output_format="text", echo=print,
                    echo_err=print_err) -> MetricsSummary:
    """Measure a model (default: the project's final export) on the project's records; print the metrics
    (text), the metrics and one row per tag (json), or the rows per tag alone (csv)."""
    config = load_config(project_path)
    tags = load_tags(config.project_dir / "tags.txt")
    records = select_records(config, split, start_id, end_id)
    files = resolve_model_files(project_path, model_path)
    threshold = config.validation_threshold if threshold is None else float(threshold)
    if not 0.0 <= threshold <= 1.0:
        raise UserError(f"--threshold: must be in [0, 1], got {threshold}")
    if output_format == "text":  # first, before the minutes of scoring
        echo(f"Model: {files.model} ({files.kind})")

    from deepdanbooru.inference.predict import check_output_width, configure_devices, model_input_size
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.models.losses import project_loss
    from deepdanbooru.pipeline.packed import scoring_input
    from deepdanbooru.pipeline.gaps import PositionGaps
    from deepdanbooru.scoring.scorer import BatchScorer, measure

    configure_devices(allow_gpu)
    model = load_model_file(files.model)
    check_output_width(model, files.model, tags, files.tags)
    height, width = model_input_size(model, files.model, config)
    scoring = scoring_input(config.project_dir, config, records, tags, height=height, width=width,
                            batch_size=batch_size)
    if scoring.notice:
        echo_err(scoring.notice)
    paths, dataset = scoring.paths, scoring.dataset
    gaps = PositionGaps()
    try:
        metrics = measure(BatchScorer(model, project_loss(config, "none"), height, width), dataset, threshold,
                          observe=gaps.observe,
                          categories=category_indices(tag_categories(tags, config.project_dir)))
    except ValueError as error:
        raise ModelError(file_field(files.model, None, f"unusable scores: {error}")) from None
    summary = MetricsSummary(model=files.model, split=split, records=len(paths), result=metrics.result())
    for index in gaps.missing(range(len(paths))).tolist():
        reason = scoring.diagnose(paths[index], config.max_image_pixels)
        summary.skipped.append((Path(paths[index]), reason))
        echo_err(f"skipped {paths[index]}: {reason}")
    if metrics.samples == 0:
        raise DatasetError(f"none of the {len(paths)} images could be read; see the reasons above")

    ids = (records.ids[0], records.ids[-1])
    agreement = threshold_agreement(files.model, tags, summary.result["per_tag"])
    if output_format in ("json", "csv"):
        source = read_source_figures(config.project_dir, split, start_id, end_id, len(paths))
        rows = per_tag_rows(tags, summary.result, source)
        if output_format == "csv":
            echo(per_tag_csv(rows).rstrip("\n"))
            return summary
        from deepdanbooru.scoring.metrics import json_ready

        echo(json.dumps(json_ready({
            "model": str(files.model), "model_kind": files.kind, "split": split, "start_id": start_id, "end_id": end_id,
            "first_id": ids[0], "last_id": ids[1], "records": len(paths), "skipped": len(summary.skipped),
            "metrics": summary.metrics, "source": None if source is None else source.as_json(),
            "thresholds": agreement,
            "per_tag": rows}), allow_nan=False))
        return summary
    echo(f"Records: {len(paths)} ({split} split, ids {ids[0]}..{ids[1]}), {len(summary.skipped)} unreadable skipped")
    scalars = summary.metrics
    names = [name for name in _LEAD if name in scalars] + [name for name in scalars if name not in _LEAD]
    width_ = max(len(name) for name in names)
    for name in names:
        echo(f"{name:<{width_}}  {group_mean_text(name, scalars)}")
    for line in coverage_lines(scalars):
        echo(f"over: {line}")
    echo(f"thresholds: {agreement['text']}")
    kept = kept_text(config.project_dir, split, start_id, end_id, tags, summary.result["per_tag"], len(paths))
    if kept:
        echo(kept)
    return summary


def kept_text(project_dir: Path, split: str, start_id, end_id, tags, per_tag: dict, records: int) -> str | None:
    """train-project's closing "Kept from the source" line for these figures, where the source was measured on
    these posts; None for a project without a source, or another split. A damaged source file is the json
    output's error; the text output does without the line."""
    from deepdanbooru.scoring.kept import kept_line, kept_on

    try:
        source = read_source_figures(project_dir, split, start_id, end_id, records)
    except UserError:
        return None
    if source is None or not source.same_posts:
        return None
    return kept_line(kept_on(source.ap, tags, per_tag))


def threshold_agreement(model: Path, tags, per_tag: dict) -> dict:
    """Whether the default thresholds derived on these records are those of the *.thresholds.csv beside the model,
    which evaluate, the report and export-bundle use: on the split training measured, they are."""
    from deepdanbooru.inference.model_files import DEFAULT_THRESHOLD, thresholds_beside
    from deepdanbooru.scoring.thresholds import default_thresholds, read_thresholds_csv

    derived = [float(value) for value in default_thresholds(per_tag)]
    beside = thresholds_beside(Path(model))
    if beside is None:
        return {"file": None, "same": None, "tags": len(tags),
                "text": "derived on these records by the rule of *.thresholds.csv; the model has none beside it, so "
                        f"evaluate uses {DEFAULT_THRESHOLD:g} for every tag"}
    written = read_thresholds_csv(beside)
    same = sum(1 for tag, value in zip(tags, derived)
               if written.get(tag, DEFAULT_THRESHOLD) == value or abs(written.get(tag, DEFAULT_THRESHOLD) - value) < 1e-9)
    text = f"{beside}, which evaluate uses: {same} of {len(tags)} tags as derived on these records"
    if same < len(tags):
        text += " (the others differ: these are not the records, or not the model, the file was written from)"
    return {"file": str(beside), "same": same, "tags": len(tags), "text": text}
