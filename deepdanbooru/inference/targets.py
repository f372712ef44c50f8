"""Which image files an evaluate run covers, and in what order.

Standard library only, so it can be tested and used without TensorFlow.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from deepdanbooru.errors import UserError, file_field
from deepdanbooru.formats import folder_filters

DEFAULT_FOLDER_FILTERS = folder_filters()

_RUNS = re.compile(r"(\d+)")


class TargetError(UserError):
    """An evaluate target is missing, or a folder was given without --allow-folder."""


def natural_key(text: str) -> tuple:
    """Sort key under which 'img2' < 'img10': digit runs compare as numbers.

    Text runs compare case-insensitively; the exact text breaks ties so the
    order is total and the same on every machine.
    """
    parts = []
    for index, run in enumerate(_RUNS.split(text)):
        if index % 2:
            # (0, number) sorts before (1, text): digits before letters, as in a plain sort.
            parts.append((0, int(run), ""))
        elif run:
            parts.append((1, 0, run.casefold()))
    return tuple(parts), text


def natural_path_key(path) -> tuple:
    """Compare directory by directory, so 'a/z.png' sorts before 'a1/b.png'."""
    return tuple(natural_key(part) for part in Path(path).parts)


def parse_filters(folder_filters: str) -> list[str]:
    filters = [item.strip() for item in folder_filters.split(",") if item.strip()]
    if not filters:
        raise TargetError("--folder-filters: no pattern given")
    return filters


def _walk(folder: Path, filters: list[str]) -> list[Path]:
    found = []
    # Symlinked folders are not followed: a link to a parent would loop forever.
    for directory, subdirectories, files in os.walk(folder, onerror=_raise_walk_error):
        subdirectories.sort()
        for name in files:
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in filters):
                found.append(Path(directory) / name)
    return found


def _raise_walk_error(error: OSError):
    raise TargetError(file_field(error.filename, None, f"cannot list folder: {error.strerror}"))


def collect_targets(targets, allow_folder: bool = False, folder_filters: str = DEFAULT_FOLDER_FILTERS,
                    missing: list | None = None) -> list[Path]:
    """Files named directly, plus files under folders (recursively) matching a filter.

    A file named directly is taken whatever its name; a path reached twice is
    listed once. The result is in natural order. With a `missing` list, a
    target that does not exist is appended to it as (path, reason) instead of
    stopping the whole batch.
    """
    filters = parse_filters(folder_filters)
    found: dict[str, Path] = {}
    for target in targets:
        path = Path(target)
        if path.is_file():
            candidates = [path]
        elif path.is_dir():
            if not allow_folder:
                raise TargetError(file_field(path, None, "is a folder; pass --allow-folder to evaluate the images in it"))
            candidates = _walk(path, filters)
        elif path.exists():
            raise TargetError(file_field(path, None, "is neither a file nor a folder"))
        elif missing is not None:
            missing.append((path, "not found"))
            continue
        else:
            raise TargetError(file_field(path, None, "not found"))
        for candidate in candidates:
            found.setdefault(os.path.normcase(os.path.abspath(candidate)), candidate)
    return sorted(found.values(), key=natural_path_key)


def sidecar_path(image_path, extension: str = ".txt") -> Path:
    """image.png -> image.txt (or the given extension), the caption file beside the image (DeepDanbooru's --save-txt)."""
    return Path(image_path).with_suffix(extension)
