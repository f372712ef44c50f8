"""create-project: a new project directory with the default project.json, or a recipe's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from deepdanbooru import hardware
from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.project.config import default_project_json, parse_config
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.recipes import DEFAULT_RECIPE, RECIPES


def recipe_project_json(recipe: str, project_dir: Path, settings=None) -> dict:
    """The defaults with the recipe's values, then `settings`, laid over them, checked like a project.json."""
    if recipe not in RECIPES:
        raise ConfigError(f"--recipe: must be one of {', '.join(RECIPES)}, got {recipe!r}")
    data = {**default_project_json(), **RECIPES[recipe], **(settings or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a key this version does not know would be ignored: refuse it
        try:
            # Errors name the recipe, not the project.json that is not written yet.
            parse_config(data, project_dir, Path(f"--recipe {recipe}"))
        except UserWarning as warning:
            raise ConfigError(str(warning)) from None
    return data


def _keep_trained_config(paths) -> Path | None:
    """--overwrite over a project something was trained with: a copy of its project.json (the settings a resume
    and the exports need), beside it; None when nothing was trained or there is no project.json."""
    from deepdanbooru.project.trained import keep_copy, trained_with_tags

    if not paths.config.is_file() or not trained_with_tags(paths):
        return None
    return keep_copy(paths.config)


def create_project(project_path, overwrite: bool = False, echo=print, recipe: str = DEFAULT_RECIPE,
                   settings=None, notes=()) -> Path:
    """settings: project.json values fitted to a database (dataset.fit), with `notes` saying why."""
    paths = ProjectPaths(project_path)
    data = recipe_project_json(recipe, paths.root, settings)
    if paths.root.exists() and not paths.root.is_dir():
        raise ConfigError(f"{paths.root}: exists and is not a directory")
    if paths.config.exists() and not overwrite:
        raise ConfigError(file_field(paths.config, None, "already exists; use --overwrite to replace it"))
    gpus = hardware.find_gpus()
    if gpus:
        # Tensor cores run half-precision matrix work several times faster than float32; on a CPU-only
        # machine train-project ignores the key, so the project still trains where it is copied to.
        data["mixed_precision"] = True
    paths.root.mkdir(parents=True, exist_ok=True)
    kept = _keep_trained_config(paths)
    write_text_atomic(paths.config, json.dumps(data, indent=4) + "\n")
    echo(f"Created {paths.config}" + ("" if recipe == DEFAULT_RECIPE else f" (recipe {recipe})"))
    if kept is not None:
        echo(f"Kept the previous {paths.config.name} as {kept}: this project's checkpoints or exported models "
             "were trained with it, and train-project refuses to resume them with another model or input size")
    if settings and "database_path" in settings:
        echo(f"database_path: {settings['database_path']} (relative to the project folder)")
    for line in notes:
        echo(line)
    steps = [f"deepdanbooru make-tags {paths.root}   (or write {paths.tags} yourself, one tag a line)",
             f"deepdanbooru preflight {paths.root}", f"deepdanbooru train-project {paths.root}"]
    if not settings or "database_path" not in settings:
        steps.insert(0, f"set database_path in {paths.config} to your dataset's SQLite file "
                        "(a relative path is resolved from the project folder), or create the project with --database")
    if gpus:
        echo(f"  this machine has {hardware.describe(gpus)}: mixed_precision is true (docs/choosing.md)")
    echo("Next steps:")
    for number, step in enumerate(steps, 1):
        echo(f"  {number}. {step}")
    return paths.config
