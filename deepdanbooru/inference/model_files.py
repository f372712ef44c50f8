"""Which model file and tags file an inference command uses.

Standard library only: the choice is made (and a missing model reported)
before TensorFlow is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, UserError, file_field
from deepdanbooru.inference.targets import natural_key
from deepdanbooru.project.config import DEFAULT_MAX_IMAGE_PIXELS, ProjectConfig, load_config
from deepdanbooru.project.paths import ProjectPaths


class ModelSourceError(UserError):
    """The options do not say which model to use, or say it twice."""


@dataclass(frozen=True)
class ModelFiles:
    model: Path
    tags: Path
    # Set when the model comes from a project: its input size and image limits apply.
    config: ProjectConfig | None = None

    @property
    def max_image_pixels(self) -> int:
        return self.config.max_image_pixels if self.config else DEFAULT_MAX_IMAGE_PIXELS


def project_model(config: ProjectConfig) -> Path:
    """The project's final export; else the float32 copy of it; else DeepDanbooru's legacy .h5.

    The float32 copy comes first only when the main export is missing; a
    mixed-precision export still answers in float32 (its output layer is float32).
    """
    paths = ProjectPaths(config.project_dir)
    final = paths.final_export(config.model)
    candidates = [final, ProjectPaths.float32_copy(final), paths.legacy_export(config.model)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    epochs = sorted(config.project_dir.glob(f"model-{config.model}.e*.keras"), key=lambda p: natural_key(p.name))
    hint = f"; an epoch export exists, use it with --model-path {epochs[-1]}" if epochs else \
        "; train it first with `deepdanbooru train-project`"
    looked = ", ".join(candidate.name for candidate in candidates)
    raise ModelError(file_field(config.project_dir, None, f"no exported model (looked for {looked}){hint}"))


def resolve_model_files(project_path=None, model_path=None, tags_path=None) -> ModelFiles:
    """--project-path alone, or --model-path with --tags-path (a project may supply what is missing)."""
    if project_path is None and model_path is None:
        raise ModelSourceError("give --project-path, or --model-path with --tags-path")
    config = load_config(project_path) if project_path is not None else None
    if model_path is not None and tags_path is None and config is None:
        raise ModelSourceError("--model-path needs --tags-path (the tags.txt the model was trained with)")
    model = Path(model_path) if model_path is not None else project_model(config)
    tags = Path(tags_path) if tags_path is not None else ProjectPaths(config.project_dir).tags
    if not model.is_file():
        raise ModelError(file_field(model, None, "model file not found"))
    return ModelFiles(model=model, tags=tags, config=config)


def resolve_model_source(project_path=None, model_path=None) -> Path:
    """The model file alone (conversion needs no tags): --model-path wins over the project's export."""
    if model_path is not None:
        model = Path(model_path)
        if not model.is_file():
            raise ModelError(file_field(model, None, "model file not found"))
        return model
    if project_path is None:
        raise ModelSourceError("give --project-path or --model-path")
    return project_model(load_config(project_path))
