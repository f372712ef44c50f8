"""create-project: a new project directory with the default project.json."""

from __future__ import annotations

import json
from pathlib import Path

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.project.config import default_project_json
from deepdanbooru.project.paths import ProjectPaths


def create_project(project_path, force: bool = False, echo=print) -> Path:
    paths = ProjectPaths(project_path)
    if paths.root.exists() and not paths.root.is_dir():
        raise ConfigError(f"{paths.root}: exists and is not a directory")
    if paths.config.exists() and not force:
        raise ConfigError(file_field(paths.config, None, "already exists; use --force to overwrite it"))
    paths.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(paths.config, json.dumps(default_project_json(), indent=4) + "\n")
    echo(f"Created {paths.config}")
    echo("Next steps:")
    echo(f"  1. put your output vocabulary in {paths.tags} (one tag a line)")
    echo(f"  2. set database_path in {paths.config} to your dataset's SQLite file")
    echo(f"  3. deepdanbooru preflight {paths.root}")
    echo(f"  4. deepdanbooru train-project {paths.root}")
    return paths.config
