"""deepdanbooru report: read what the run wrote, score the validation split once, write the page."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ConfigError, DatasetError, UserError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.inference.output import print_err
from deepdanbooru.report import charts, summary, tables
from deepdanbooru.report.runfiles import read_run_files

REPORT_FILE = "report.html"


@dataclass(frozen=True)
class ReportWritten:
    page: Path
    folder: Path
    pictures: int
    tags: int
    seconds: float


def folder_beside(page: Path) -> Path:
    """report.html -> report_files/ (the name browsers give a saved page's folder)."""
    return page.with_name(f"{page.stem}_files")


def _model_choice(config, model_path):
    """(model file, what it is, tags file): --model-path, else the best export, else what evaluate would use."""
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.project.paths import ProjectPaths
    from deepdanbooru.project.trained import trained_with_tags

    paths = ProjectPaths(config.project_dir)
    if model_path is None:
        if not trained_with_tags(paths):
            raise UserError(f"{config.project_dir}: not trained yet (no checkpoint, no exported model): run "
                            f"`deepdanbooru train-project {config.project_dir}` first, then report on it")
        best = paths.best_export(config.model)
        if best.is_file():
            return best, "the project's best export", paths.tags
    files = resolve_model_files(config.project_dir, model_path)
    return files.model, files.kind, files.tags


def _split(config):
    """(training records, validation records), the trainer's split, or the line that says how to make one."""
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.project.paths import ProjectPaths
    from deepdanbooru.runstate.state import read_state_json
    from deepdanbooru.scoring.split import split_for_run

    if config.validation_fraction <= 0:
        raise ConfigError(file_field(
            config.config_path, "validation_fraction",
            "is 0: the project has no validation split to report on; set it (0.05 keeps 5% of the posts out of "
            "training) and train again, so the model is judged on pictures it never trained on"))
    database = config.require_database()
    records = load_records(database, config.minimum_tag_count, config.image_extensions)
    train, validation, _ = split_for_run(records, config.validation_fraction, config.seed,
                                         read_state_json(ProjectPaths(config.project_dir).checkpoints)[0])
    if len(validation) == 0:
        raise DatasetError(file_field(
            database, "posts", f"none of the {len(records):,} eligible posts falls in the validation split "
            f"(validation_fraction {config.validation_fraction:g} of {config.config_path}); raise it and train "
            "again, or add posts"))
    return train, validation


def _output(config, output) -> Path:
    page = Path(output) if output is not None else config.project_dir / REPORT_FILE
    if page.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--save-path {page}: must end in .html")
    if not page.parent.is_dir():
        raise UserError(f"--save-path {page}: folder {page.parent} not found")
    if page.is_dir():
        raise UserError(f"--save-path {page}: is a folder")
    _check_replaceable(page)
    return page


# The thumbnails report writes into <page>_files: <post id>.jpg; and what file browsers leave in a folder.
_THUMBNAIL = re.compile(r"\d+\.jpg")
_BROWSER_FILES = {".DS_Store", "Thumbs.db", "desktop.ini"}


def _check_replaceable(page: Path) -> None:
    """A page and pictures folder already there are replaced only when report wrote them: another .html (or a
    folder of the same name holding other files) is the user's. Thumbnails (<post id>.jpg) count as report's only
    beside a page it wrote: without one, a folder of numbered photos is someone's own."""
    from deepdanbooru.report.page import GENERATOR

    ours = page.exists()
    if ours:
        text = page.read_bytes().decode("utf-8", errors="replace")
        # Pages written before the generator line say who made them in their first note.
        if f'<meta name="generator" content="{GENERATOR}">' not in text and \
                '<p class="note">Made by deepdanbooru report at ' not in text:
            raise UserError(file_field(page, None, "not replaced: it is not a page deepdanbooru report wrote; "
                                                   "give another --save-path, or move it away"))
    folder = folder_beside(page)
    if folder.is_symlink() or folder.exists() and not folder.is_dir():
        foreign = folder
    elif folder.is_dir():
        foreign = next((entry for entry in folder.iterdir()
                        if not (((ours and _THUMBNAIL.fullmatch(entry.name)) or entry.name in _BROWSER_FILES)
                                and entry.is_file())), None)
    else:
        foreign = None
    if foreign is not None:
        whose = ("a thumbnail report wrote" if ours or not _THUMBNAIL.fullmatch(foreign.name)
                 else f"a thumbnail of a page report wrote (no {page.name} beside it)")
        raise UserError(file_field(folder, None, (
            f"not replaced: the page's pictures go here, and {foreign.name} is not {whose}; "
            "give another --save-path, or move it away")))


def _thumbnails(pictures, page: Path, echo_err) -> Path:
    """Writes every shown picture's thumbnail into a new folder beside `page`; returns that folder (not yet
    in place: the caller moves it once the page is written)."""
    from deepdanbooru.report.progress import Bar
    from deepdanbooru.report.thumbs import write_thumbnail

    staging = Path(tempfile.mkdtemp(prefix=f".{page.stem}_files.", dir=page.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's folder is private; a page's pictures are not
    bar = Bar("Thumbnails", len(pictures))
    name = folder_beside(page).name
    for number, picture in enumerate(pictures, start=1):
        file = f"{picture['id']}.jpg"
        problem = write_thumbnail(picture.pop("path"), staging / file)
        if problem is None:
            picture["thumb"] = f"{name}/{file}"
        else:
            echo_err(f"no thumbnail for post {picture['id']}: {problem}")
        bar.update(number)
    bar.close()
    return staging


def _swap_in(staging: Path, folder: Path) -> None:
    """Replaces `folder` with `staging`; the old folder goes only once the new one has its name."""
    old = None
    if folder.exists() or folder.is_symlink():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        folder.rename(old)
    try:
        staging.rename(folder)
    except BaseException:
        if old is not None:
            old.rename(folder)  # what was there stays
        raise
    if old is None:
        return
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()  # a file or link where the pictures' folder goes


def make_report(project_path, *, model_path=None, output=None, batch_size=32, allow_gpu=False, echo=print,
                echo_err=print_err) -> ReportWritten:
    from deepdanbooru.project.categories import category_indices, tag_categories
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.tags import load_tags, tag_counts

    started = time.monotonic()
    config = load_config(project_path)
    tags = load_tags(config.project_dir / "tags.txt")
    page = _output(config, output)
    model_file, kind, tags_path = _model_choice(config, model_path)
    charts.require_matplotlib()
    files = read_run_files(config.project_dir, config.model)
    train, validation = _split(config)

    from deepdanbooru.report.score import load_checked, score_split

    model = load_checked(config, model_file, tags, tags_path, allow_gpu)
    # Once the model is known to fit, so that a model that does not gets its one error line alone.
    echo(f"Model: {model_file} ({kind})")
    categories = tag_categories(tags, config.project_dir)
    scored = score_split(config, model, model_file, tags, validation, category_indices(categories),
                         batch_size=batch_size, echo_err=echo_err)
    result = scored.metrics.result()
    thresholds, precision, recall = scored.metrics.tag_curves(tables.CURVE_STEP)
    source_ap = (files.source_ap or {}).get("ap") if isinstance((files.source_ap or {}).get("ap"), dict) else None
    columns = tables.tag_columns(tags, categories, tag_counts(train.tag_strings, tags),
                                 tag_counts(validation.tag_strings, tags), result, source_ap)
    # The pictures' mistakes at the default thresholds: a withheld tag is never predicted.
    from deepdanbooru.scoring.thresholds import default_thresholds

    defaults = default_thresholds(result["per_tag"])
    pictures, gallery, worst = tables.pictures_and_gallery(scored.pictures, defaults, validation)
    data = {"tags": columns, "curves": tables.curve_arrays(thresholds, precision, recall), "pictures": pictures,
            "gallery": gallery, "worst": worst, "working_threshold": result["threshold"],
            "global_threshold": result["global_threshold"], "min_support": result["min_support"],
            "validation_pictures": len(scored.pictures),
            "vocabulary": tables.vocabulary_section(files.vocabulary, tags)}
    split = {"train": len(train), "validation": len(validation), "tags": len(tags)}
    run_rows = summary.run_rows(config, files, kind, model_file, split)
    if scored.skipped:
        run_rows.append(("Unreadable", f"{len(scored.skipped):,} validation pictures skipped (listed on stderr)"))
    drawn = charts.run_charts(files.train_rows, files.validation_rows,
                              [(stop.step, stop.label) for stop in summary.stops(files.history)])
    notes = (f"Made by deepdanbooru report at {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC from "
             f"{', '.join(str(path.name) for path in files.read) or 'no run files'} and {len(scored.pictures):,} "
             f"validation pictures scored in {scored.seconds:.0f} s.")

    from deepdanbooru.report.page import render

    staging = _thumbnails(pictures, page, echo_err)
    try:
        html = render(f"{config.project_dir.resolve().name}: what the tagger learned", run_rows,
                      summary.figure_rows(result) + summary.kept_rows(files.source_ap, tags, result, len(validation)),
                      drawn, data, data["vocabulary"], notes)
        write_text_atomic(page, html)
        _swap_in(staging, folder_beside(page))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    written = ReportWritten(page, folder_beside(page), len(scored.pictures), len(tags), time.monotonic() - started)
    echo(f"Wrote {page} ({page.stat().st_size / 1e6:.1f} MB) and {len(pictures):,} thumbnails in "
         f"{written.folder}: {written.pictures:,} validation pictures, {written.tags:,} tags; open it in a browser")
    return written
