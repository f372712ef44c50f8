"""create-project: a new project directory with the default project.json."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.project.config import default_project_json
from deepdanbooru.project.paths import ProjectPaths


def temporary_beside(path) -> tuple[int, str]:
    """A new hidden file next to `path` (same file system, so the final rename is atomic).

    Created with mode 0o666 as open() does, so the umask decides who may read what the tool writes
    (mkstemp's private 0o600 would stay with the file after the rename). Returns (descriptor, path).
    """
    path = Path(path)
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(temporary)
        except FileExistsError:
            continue


def write_bytes_atomic(path, content: bytes) -> None:
    """Write beside the target and rename, so a reader never sees half a file."""
    path = Path(path)
    handle, temporary = temporary_beside(path)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text_atomic(path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def create_project(project_path, overwrite: bool = False, echo=print) -> Path:
    paths = ProjectPaths(project_path)
    if paths.root.exists() and not paths.root.is_dir():
        raise ConfigError(f"{paths.root}: exists and is not a directory")
    if paths.config.exists() and not overwrite:
        raise ConfigError(file_field(paths.config, None, "already exists; use --overwrite to replace it"))
    paths.root.mkdir(parents=True, exist_ok=True)
    write_text_atomic(paths.config, json.dumps(default_project_json(), indent=4) + "\n")
    echo(f"Created {paths.config}")
    echo("Next steps:")
    echo(f"  1. set database_path in {paths.config} to your dataset's SQLite file "
         "(a relative path is resolved from the project folder)")
    echo(f"  2. deepdanbooru make-tags {paths.root}   (or write {paths.tags} yourself, one tag a line)")
    echo(f"  3. deepdanbooru preflight {paths.root}")
    echo(f"  4. deepdanbooru train-project {paths.root}")
    return paths.config
