"""--source-model before TensorFlow starts: the source's vocabulary, categories and input size.

Standard library only: train-project plans a run, a wrong input size or a bad checkpoint folder
included, in a fraction of a second. A source is a model file (ours, DeepDanbooru's, import-model's)
or a timm checkpoint folder (config.json, model.safetensors, selected_tags.csv).

Tags map by name onto tags.txt whatever their spelling ('long hair', 'Long_Hair' and 'long_hair'
are one tag, as captions.tag_key says), and WD's rating rows (general, sensitive, questionable,
explicit, category 9) are the project's `rating:` tags of the same name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.captions import tag_key
from deepdanbooru.errors import ConfigError, ModelError, TagsError, TrainingError, file_field
from deepdanbooru.models.vocabulary import read_model_tags
from deepdanbooru.project.resume import record_start, source_path
from deepdanbooru.project import categories as cat
from deepdanbooru.project.tags import load_tags


# timm architecture prefixes whose checkpoints import at another input size (models.timm: the families with
# `resized`).
RESAMPLABLE = ("vit_", "eva02_")


@dataclass(frozen=True)
class SourceModel:
    path: Path
    tags: tuple[str, ...] | None  # one per output, in the project's spelling of the rating rows; None: unknown
    categories: tuple[int, ...] | None  # Danbooru category id per output, when the source records them
    input_size: tuple[int, int] | None = None  # (height, width), known before building for a folder
    folder: bool = False  # a timm checkpoint folder, imported when the model is made
    architecture: str | None = None  # a folder's timm architecture

    @property
    def resamplable(self) -> bool:
        """A ViT's or EVA02's position table can be resampled to another token grid (EVA02's rotary tables are
        recomputed for it); nothing else here resizes."""
        return self.folder and self.architecture.startswith(RESAMPLABLE)


def claim_project(plan, latest: str | None) -> None:
    """Once the model is made (a refused --source-model leaves the project as it was): the logs folder, and for
    a fresh run from --source-model, checkpoints/start.json."""
    plan.paths.logs.mkdir(parents=True, exist_ok=True)
    if plan.source_model is not None and not latest:
        record_start(plan.paths.checkpoints, plan.source_model, plan.source_tags_file)


def check_resumed_source(recorded: str | None, source_model, checkpoints) -> None:
    """Resuming a checkpoint fine-tuned from `recorded`: a --source-model other than that one is refused in
    one line (the same one, or none, resumes)."""
    if not recorded or source_model is None or source_path(source_model) == Path(recorded):
        return
    raise TrainingError(file_field(checkpoints, None, (
        f"the checkpoint was fine-tuned from --source-model {recorded}, not {source_model}; leave --source-model "
        f"out (or give that one) to resume, or delete {checkpoints} to start fresh from another")))


def read_source_model(path, source_tags=None, option: str = "--source-model") -> SourceModel:
    """The source's vocabulary, categories and (for a folder) input size; one line for a bad source, naming
    `option`, the command's option that gave the path."""
    from deepdanbooru.models.timm.source import class_names, is_checkpoint_folder, read_source

    path = Path(path)
    if path.is_dir():
        if not is_checkpoint_folder(path):
            raise ModelError(file_field(path, None, f"{option} folder is not a timm checkpoint (it needs "
                                                    "config.json and model.safetensors)"))
        source = read_source(path)
        tags = tuple(load_tags(source_tags)) if source_tags is not None else class_names(source)
        categories = source.categories if source_tags is None else None
        return SourceModel(path, _spelled(tags, categories), categories, source.input_size, folder=True,
                           architecture=source.architecture)
    if not path.is_file():
        raise ModelError(file_field(path, None, f"{option} not found (give a .keras/.h5 file or a timm "
                                                "checkpoint folder)"))
    tags = source_model_tags(path, source_tags)
    categories = _categories_beside(path, tags)
    return SourceModel(path, _spelled(tags, categories), categories)


def source_model_tags(source_model: Path, source_tags=None) -> tuple[str, ...] | None:
    """--source-tags FILE; else the tags the model file records (every export of ours and every
    import-model file records them); else the `<stem>.thresholds.csv` that training writes beside an
    export when validation is on; else the `<stem>.tags.txt` import-model writes; else None."""
    if source_tags is not None:
        return tuple(load_tags(source_tags))
    recorded = read_model_tags(source_model)
    if recorded is not None:
        return recorded
    stem = source_model.stem.removesuffix(".float32")
    sidecar = source_model.with_name(stem + ".thresholds.csv")
    if not sidecar.is_file():
        imported = source_model.with_name(stem + ".tags.txt")
        return tuple(load_tags(imported)) if imported.is_file() else None
    from deepdanbooru.scoring.thresholds import read_thresholds_csv

    return tuple(read_thresholds_csv(sidecar))


def _categories_beside(path: Path, tags) -> tuple[int, ...] | None:
    """The `<stem>.categories.json` import-model writes beside the model, when it fits the tags."""
    candidate = cat.categories_beside(path)
    if tags is None or not candidate.is_file():
        return None
    try:
        return tuple(cat.parse_categories(candidate.read_text(encoding="utf-8"), candidate, len(tags)))
    except (OSError, UnicodeDecodeError) as error:
        raise TagsError(file_field(candidate, None, f"cannot be read: {error}")) from None


def _spelled(tags, categories):
    """WD's rating rows carry no `rating:` prefix; the project's rating tags do."""
    if tags is None or categories is None:
        return tags
    return tuple(f"{cat.RATING_PREFIX}{tag}" if category == cat.RATING and not tag.startswith(cat.RATING_PREFIX)
                 else tag for tag, category in zip(tags, categories))


def in_project_spelling(source_tags, tags) -> tuple[str, ...]:
    """`source_tags` with each one that is a tag of tags.txt under another spelling written as tags.txt does."""
    ours = {tag_key(tag): tag for tag in tags}
    return tuple(ours.get(tag_key(tag), tag) for tag in source_tags)


def check_input_size(source: SourceModel, config) -> None:
    """A folder's input size is the checkpoint's: project.json must ask for it, or for a ViT or EVA02 say
    resample_positions."""
    if source.input_size is None or source.input_size == (config.image_height, config.image_width):
        return
    if config.resample_positions and source.resamplable:
        return
    height, width = source.input_size
    if source.resamplable:
        hint = " (or set resample_positions true to resample the checkpoint's position table)"
    elif config.resample_positions:
        hint = f" (resample_positions is for ViT and EVA02 checkpoints; {source.architecture} is not one)"
    else:
        hint = ""
    raise ConfigError(file_field(config.config_path, "image_width/image_height", (
        f"{config.image_width}x{config.image_height}, but --source-model {source.path} takes {width}x{height} "
        f"(pretrained_cfg.input_size of its config.json); set image_width {width} and image_height "
        f"{height}{hint}")))


def carry_categories(plan, echo=print) -> None:
    """The source's categories for the tags.txt tags it shares, as the project's categories.json, so
    validation and export-bundle know ratings, general and character tags (the chief calls it). An
    existing categories.json is the user's and is never replaced: a disagreement is only reported."""
    source = plan.source
    if source is None or source.categories is None:
        return
    by_key = {tag_key(tag): category for tag, category in zip(source.tags, source.categories)}
    carried = [by_key.get(tag_key(tag)) for tag in plan.tags]
    path = plan.paths.root / cat.CATEGORIES_FILE
    if path.is_file():
        mine = cat.tag_categories(plan.tags, plan.paths.root)
        differ = [tag for tag, theirs, ours in zip(plan.tags, carried, mine) if theirs is not None and theirs != ours]
        if differ:
            echo(f"notice: {path} gives {len(differ):,} tag(s) another category than --source-model "
                 f"{source.path.name} (e.g. {differ[0]}); {path.name} is kept as it is")
        return
    new = sum(category is None for category in carried)
    # categories.json gives every tag one; a tag the source does not know is a general tag, as without the file.
    ids = [cat.RATING if tag.startswith(cat.RATING_PREFIX) else cat.GENERAL if category is None else category
           for tag, category in zip(plan.tags, carried)]
    from deepdanbooru.fileio import write_text_atomic
    from deepdanbooru.models.timm.source import categories_json

    write_text_atomic(path, json.dumps(categories_json(ids), indent=2) + "\n")
    echo(f"Categories: {path} written from --source-model {source.path.name} ({len(ids) - new:,} tags as the "
         f"source has them, {new:,} it does not know as general)")
