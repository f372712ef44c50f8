"""create-project: a new project directory with the default project.json."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.project.config import default_project_json
from deepdanbooru.project.paths import ProjectPaths


def write_bytes_atomic(path, content: bytes) -> None:
    """Write beside the target and rename, so a reader never sees half a file."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; the file should get what open() would give it (0666 less the umask).
        os.fchmod(handle, 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_text_atomic(path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


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
