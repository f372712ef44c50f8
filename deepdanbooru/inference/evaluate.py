"""evaluate and evaluate-project: tag images with a trained model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import file_field
from deepdanbooru.inference.model_files import choose_thresholds, model_tags, resolve_model_files
from deepdanbooru.inference.caption_files import CaptionOptions, caption_text, existing_captions
from deepdanbooru.inference.output import (FORMATS, drop_undesired, make_writer, print_err, select_tags,
                                           set_category_thresholds, threshold_vector)
from deepdanbooru.inference.targets import DEFAULT_FOLDER_FILTERS, TargetError, collect_targets, sidecar_path
from deepdanbooru.project.categories import read_tag_categories
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.wording import plural


@dataclass
class EvaluationSummary:
    model: Path
    tagged: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)


@dataclass(frozen=True)
class TaggingOptions:
    """How evaluate finds the images, thresholds the scores and reports the tags (the command's options)."""

    threshold: float | None = None  # None: the per-tag CSV beside the model when there is one, else 0.5
    thresholds_csv: str | None = None
    allow_folder: bool = False
    folder_filters: str = DEFAULT_FOLDER_FILTERS
    save_txt: bool = False
    caption: CaptionOptions = CaptionOptions()  # how --save-txt writes, and what it does to files already there
    general_threshold: float | None = None  # for tags categories.json calls general; replaces the others
    character_threshold: float | None = None
    undesired_tags: str = ""  # comma-separated tags never reported
    order_by_score: bool = False  # list tags highest score first instead of in tags.txt order
    output_format: str = "text"
    batch_size: int = 32
    allow_gpu: bool = False
    compile_model: bool = True
    verbose: bool = False
    alpha: str = "white"  # transparency composited onto white, as the tagger tools do; "drop": the stored colours
    padding: str | None = None  # "border" or "white"; None: the project's padding key (border without a project)


def evaluate(targets, options: TaggingOptions = TaggingOptions(), *, project_path=None, model_path=None,
             tags_path=None, echo=print, echo_err=print_err) -> EvaluationSummary:
    """Tag every image under `targets`, writing results through `echo` as they come.

    Everything that can be checked without TensorFlow (targets, model and
    tags files, thresholds) is checked first, so a typo fails in a second.
    Missing and unreadable images are reported through `echo_err` and listed in
    the summary; the others are still tagged. The first line on `echo_err` names
    the model and the thresholds.
    threshold: None uses the per-tag CSV beside the model when there is one (else 0.5).
    """
    o = options
    if o.output_format not in FORMATS:
        raise TargetError(f"--format: must be one of {', '.join(FORMATS)}, got {o.output_format!r}")
    missing: list[tuple[Path, str]] = []
    paths = collect_targets(targets, allow_folder=o.allow_folder, folder_filters=o.folder_filters, missing=missing)
    if not paths:
        if missing:
            raise TargetError(file_field(missing[0][0], None, missing[0][1]))
        raise TargetError(f"{', '.join(map(str, targets))}: no image files found (filters: {o.folder_filters})")
    captions = o.caption.check(o.save_txt)
    existing = existing_captions(paths, captions) if o.save_txt else {}
    files = resolve_model_files(project_path, model_path, tags_path)
    tags = model_tags(files)
    choice = choose_thresholds(files.model, o.threshold, o.thresholds_csv)
    thresholds = threshold_vector(tags, choice.default, choice.csv)
    if o.general_threshold is not None or o.character_threshold is not None:
        set_category_thresholds(thresholds, read_tag_categories(tags, files.categories), files.categories,
                                o.general_threshold, o.character_threshold)
    drop_undesired(thresholds, tags, o.undesired_tags, echo_err)
    by_category = "".join(f"; {label} tags: {value}" for label, value in (("general", o.general_threshold),
                                                                            ("character", o.character_threshold))
                          if value is not None)
    echo_err(f"Model: {files.model} ({files.kind}); thresholds: {choice.description}{by_category}")
    summary = EvaluationSummary(model=files.model)
    for path, reason in missing:
        summary.skipped.append((path, reason))
        echo_err(f"skipped {path}: {reason}")

    from deepdanbooru.inference.predict import configure_devices, load_tagger

    devices = configure_devices(o.allow_gpu)
    tagger = load_tagger(files, tags, compile_model=o.compile_model, alpha=o.alpha, padding=o.padding)
    if o.verbose:
        echo_err(f"Devices: {', '.join(devices)}")
        echo_err(f"Input {tagger.height}x{tagger.width}, {len(tags)} tags from {files.tags}")
        echo_err(f"Images: {len(paths)}")

    def skip(index, reason):
        summary.skipped.append((paths[index], reason))
        echo_err(f"skipped {paths[index]}: {reason}")

    writer = make_writer(o.output_format, echo)
    started = time.perf_counter()
    for index, scores in tagger.predict(paths, o.batch_size, skip):
        pairs = select_tags(tags, scores, thresholds, by_score=o.order_by_score)
        writer.image(paths[index], pairs)
        if o.save_txt:
            sidecar = sidecar_path(paths[index], captions.extension)
            text = caption_text([tag for tag, _ in pairs], existing.get(sidecar), captions.remove_underscore,
                                captions.separator)
            try:
                write_text_atomic(sidecar, text)
            except OSError as error:
                raise TargetError(f"{sidecar}: cannot write the tags (--save-txt): {error.strerror or error}") from None
        summary.tagged += 1
    if o.verbose:
        seconds = time.perf_counter() - started
        rate = summary.tagged / seconds if seconds > 0 else 0.0
        echo_err(f"Tagged {plural(summary.tagged, 'image')} in {seconds:.1f} s ({rate:.1f} images/s); "
                 f"skipped {len(summary.skipped)}")
    elif summary.skipped:
        echo_err(f"{len(summary.skipped)} of {plural(len(paths) + len(missing), 'image')} could not be read and "
                 f"{'was' if len(summary.skipped) == 1 else 'were'} skipped")
    return summary
