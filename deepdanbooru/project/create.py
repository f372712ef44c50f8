"""create-project: a new project directory with the default project.json."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from deepdanbooru.errors import ConfigError, file_field
from deepdanbooru.project.config import default_project_json
from deepdanbooru.project.paths import ProjectPaths


def _umask() -> int:
    try:  # Linux: read it without changing it (another thread may be creating files right now)
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_mode() -> int:
    """The mode open() gives a new file: 0o666 less the umask (0644 under umask 022)."""
    return 0o666 & ~_umask()


def temporary_beside(path) -> tuple[int, str]:
    """mkstemp in path's folder, with the mode an ordinary open() would give instead of mkstemp's 0600.

    The file is renamed into place and keeps this mode, so others can read what the tool writes.
    Returns (open descriptor, temporary path).
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(handle, ordinary_mode())
    except BaseException:
        os.close(handle)
        os.unlink(temporary)
        raise
    return handle, temporary


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
