"""Which model file and tags file an inference command uses.

Standard library only: the choice is made (and a missing model reported)
before TensorFlow is imported.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, UserError, file_field
from deepdanbooru.inference.targets import natural_key
from deepdanbooru.models.vocabulary import read_model_tags
from deepdanbooru.project.categories import CATEGORIES_FILE, categories_beside
from deepdanbooru.project.config import DEFAULT_MAX_IMAGE_PIXELS, ProjectConfig, load_config
from deepdanbooru.project.paths import ProjectPaths


# What using a project's model reads of project.json: a bad training setting must not stop evaluate.
MODEL_KEYS = ("model", "image_width", "image_height", "max_image_pixels", "padding", "alpha")


class ModelSourceError(UserError):
    """The options do not say which model to use, or say it twice."""


@dataclass(frozen=True)
class ModelFiles:
    model: Path
    tags: Path
    # Set when the model comes from a project: its input size and image limits apply.
    config: ProjectConfig | None = None
    kind: str = "the given file"  # which model this is, for the first line of the output
    # The tags recorded inside the model file, when they are the vocabulary used (`tags` is then the model).
    recorded: tuple[str, ...] | None = None

    @property
    def max_image_pixels(self) -> int:
        return self.config.max_image_pixels if self.config else DEFAULT_MAX_IMAGE_PIXELS

    @property
    def categories(self) -> Path:
        """The categories file that says which tags are general, character, ...: for a model's own vocabulary
        (recorded inside it, or the .tags.txt beside it) the `<stem>.categories.json` import-model wrote beside
        it, else categories.json beside the tags file; the other of the two when only it exists."""
        beside_tags = self.tags.parent / CATEGORIES_FILE
        own = self.recorded is not None or self.tags == tags_beside(self.model)
        mine = categories_beside(self.model)
        candidates = (mine, beside_tags) if own else (beside_tags, mine)
        return next((path for path in candidates if path.is_file()), candidates[0])


def _project_model(config: ProjectConfig) -> tuple[Path, str]:
    """(file, what it is): the project's final export; else the float32 copy of it; else what a --time-limit
    stop exported; else DeepDanbooru's legacy .h5; the best export instead of any of them when its validation
    beat theirs. The float32 copy comes first only when the main export is missing; a mixed-precision export
    still answers in float32 (its output layer is float32).
    """
    paths = ProjectPaths(config.project_dir)
    name = paths.export_name(config.model)
    final = paths.final_export(name)
    candidates = [(final, "the project's final export"),
                  (ProjectPaths.float32_copy(final), "the float32 copy of the project's final export"),
                  (paths.stopped_export(name),
                   "the export of a --time-limit stop: training is not complete"),
                  (paths.legacy_export(name), "the project's DeepDanbooru .h5 export")]
    chosen = next(((candidate, kind) for candidate, kind in candidates if candidate.is_file()), None)
    best = _best_instead(paths.best_export(name), chosen)
    if best is not None:
        return best
    if chosen is not None:
        return chosen
    epochs = sorted(config.project_dir.glob(f"model-{name}.e*.keras"), key=lambda p: natural_key(p.name))
    hint = f"; an epoch export exists, use it with --model-path {epochs[-1]}" if epochs else \
        "; train it first with `deepdanbooru train-project`"
    looked = ", ".join(candidate.name for candidate, _ in candidates)
    raise ModelError(file_field(config.project_dir, None, f"no exported model (looked for {looked}){hint}"))


def _best_instead(best: Path, chosen: tuple[Path, str] | None) -> tuple[Path, str] | None:
    """(best export, why) when it is to be used rather than `chosen`: there is nothing else, or its
    validation (best.json) beats the one written beside `chosen` on the same metric. A `chosen` without
    validation figures stays: the best export may then be an earlier run's."""
    record = _json_of(best.with_name(best.stem + ".json"))
    try:
        metric, value, step = str(record["metric"]), float(record["value"]), int(record["used_minibatch"])
    except (KeyError, TypeError, ValueError):
        return None
    if not best.is_file():
        return None
    why = f"the project's best model by {metric}: {value:.4f} on validation at step {step}"
    if chosen is None:
        return best, f"{why}; there is no final export"
    model, kind = chosen
    figures = _json_of(model.with_name(model.stem.removesuffix(".float32") + ".metrics.json")).get("metrics")
    other = figures.get(metric) if isinstance(figures, dict) else None
    if not isinstance(other, (int, float)) or isinstance(other, bool):
        return None
    from deepdanbooru.scoring.metrics import is_improvement

    if not is_improvement(metric, value, other):
        return None
    return best, f"{why}, better than {other:.4f} of {model.name}, {kind}; --model-path takes another"


def _json_of(path: Path) -> dict:
    """The JSON object in `path`, or {} (missing, unreadable, not an object)."""
    import json

    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def resolve_model_files(project_path=None, model_path=None, tags_path=None) -> ModelFiles:
    """--project-path alone, or --model-path with --tags-path (a project may supply what is missing)."""
    if project_path is None and model_path is None:
        raise ModelSourceError("give --project-path, or --model-path with --tags-path")
    # `model` only finds the project's own export: with --model-path a bad value of it is a warning, not a refusal.
    uses = MODEL_KEYS if model_path is None else tuple(key for key in MODEL_KEYS if key != "model")
    config = load_config(project_path, uses=uses) if project_path is not None else None
    recorded = None
    if model_path is not None and tags_path is None and config is None:
        tags_path = tags_beside(Path(model_path))
        if tags_path is None:
            # Every export of ours and every import-model file records its tags inside.
            recorded = read_model_tags(model_path)
            if recorded is None:
                raise ModelSourceError("--model-path needs --tags-path (the tags.txt the model was trained with); "
                                       f"{model_path} records no tags and has no .tags.txt beside it")
            tags_path = model_path
    if model_path is not None:
        model, kind = Path(model_path), _given_kind(Path(model_path), config)
    else:
        model, kind = _project_model(config)
    tags = Path(tags_path) if tags_path is not None else ProjectPaths(config.project_dir).tags
    if not model.is_file():
        raise ModelError(file_field(model, None, "model file not found"))
    if recorded is None:
        # A --tags-path of as many tags is the user's naming (another language, say): said, not refused.
        check_recorded_tags(model, tags, explicit=tags_path is not None)
    return ModelFiles(model=model, tags=tags, config=config, kind=kind, recorded=recorded)


def check_recorded_tags(model: Path, tags_file: Path, explicit: bool = False) -> None:
    """Refuse a tags file other than the one `model` records it was trained with: its scores would be reported
    under other tags' names (a tags.txt replaced, reordered or edited since training). `explicit` (--tags-path):
    a file of as many tags is the user's naming, and only warned about."""
    recorded = read_model_tags(model)
    if recorded is None:  # a .h5 or a file re-saved by another tool: it cannot say
        return
    from deepdanbooru.project.tags import load_tags

    listed = tuple(load_tags(tags_file))
    if listed == recorded:
        return
    if len(listed) != len(recorded):
        difference = f"{len(listed)} tags, the model's {len(recorded)}"
    else:
        line = next(n for n, (mine, its) in enumerate(zip(listed, recorded)) if mine != its)
        difference = f"line {line + 1} is {listed[line]!r}, the model's tag {line + 1} {recorded[line]!r}"
        if sorted(listed) == sorted(recorded):
            difference += "; the same tags in another order"
        if explicit:
            warnings.warn(file_field(tags_file, None, (
                f"not the tags {model} was trained with ({difference}); its scores are named by this file, line "
                "by line")), UserWarning, stacklevel=2)
            return
    # The model's own tags are used with --model-path alone, unless a .tags.txt beside it is read instead.
    own = "" if tags_beside(model) is not None else \
        f" (`deepdanbooru evaluate --model-path {model}` without --tags-path uses the tags it records)"
    raise ModelError(file_field(tags_file, None, (
        f"not the tags {model} was trained with ({difference}); restore the tags.txt it was trained with or "
        f"train again{own}")))


def model_tags(files: ModelFiles) -> list[str]:
    """The vocabulary, one tag per output: recorded inside the model file, else the tags file's."""
    from deepdanbooru.project.tags import load_tags

    return list(files.recorded) if files.recorded is not None else load_tags(files.tags)


def _given_kind(model: Path, config: ProjectConfig | None) -> str:
    paths = ProjectPaths(config.project_dir) if config is not None else None
    if paths is not None and model.name == paths.best_export(paths.export_name(config.model)).name:
        return "the project's best model (--model-path)"
    return "the file given with --model-path"


def tags_beside(model: Path) -> Path | None:
    """The `<stem>.tags.txt` import-model writes beside the model it imports, if there is one."""
    candidate = model.with_name(f"{model.stem.removesuffix('.float32')}.tags.txt")
    return candidate if candidate.is_file() else None


def thresholds_beside(model: Path) -> Path | None:
    """The per-tag thresholds CSV training wrote beside an export (a float32 copy shares its export's)."""
    stem = model.stem.removesuffix(".float32")
    candidate = model.with_name(f"{stem}.thresholds.csv")
    return candidate if candidate.is_file() else None


def resolve_model_source(project_path=None, model_path=None) -> tuple[Path, str]:
    """(the model file alone, what it is): conversion needs no tags; --model-path wins over the project's export."""
    if model_path is not None:
        model = Path(model_path)
        if not model.is_file():
            raise ModelError(file_field(model, None, "model file not found"))
        return model, "the file given with --model-path"
    if project_path is None:
        raise ModelSourceError("give --project-path or --model-path")
    return _project_model(load_config(project_path, uses=MODEL_KEYS))


DEFAULT_THRESHOLD = 0.5


@dataclass(frozen=True)
class ThresholdChoice:
    csv: Path | None  # per-tag thresholds, or None
    default: float  # for every tag the CSV does not list
    description: str


def choose_thresholds(model: Path, threshold: float | None, thresholds_csv=None) -> ThresholdChoice:
    """--thresholds-csv, else --threshold for every tag, else the CSV beside the model, else 0.5.

    Training calibrates a threshold per tag on the validation split and writes it beside each export;
    using it unless told otherwise is what a user of the project expects.
    """
    default = DEFAULT_THRESHOLD if threshold is None else threshold
    if thresholds_csv is not None:
        return ThresholdChoice(Path(thresholds_csv), default,
                               f"per tag from {thresholds_csv} ({default:g} for tags it does not list)")
    if threshold is not None:
        return ThresholdChoice(None, default, f"{default:g} for every tag (--threshold)")
    beside = thresholds_beside(model)
    if beside is not None:
        from deepdanbooru.scoring.thresholds import describe_threshold_rows, read_threshold_rows

        held = describe_threshold_rows(read_threshold_rows(beside))
        return ThresholdChoice(beside, default, f"per tag from {beside}: {held} ({default:g} for tags it does not "
                                                "list; --threshold sets one for every tag)")
    return ThresholdChoice(None, default, f"{default:g} for every tag")
