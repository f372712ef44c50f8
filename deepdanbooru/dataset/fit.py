"""create-project --database: the project.json values that fit what a dataset database holds.

Standard library only. Reads the posts table once, read-only: which image
formats it holds (image_extensions) and how many general tags its posts have
(minimum_tag_count), so a dataset of own pictures with short captions trains
without the user first finding out why no record is eligible.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from deepdanbooru.dataset.records import check_posts_table, connect_read_only
from deepdanbooru.errors import DatasetError, file_field
from deepdanbooru.formats import DEEPDANBOORU_EXTENSIONS, IMAGE_EXTENSIONS
from deepdanbooru.project.config import KEY_BY_NAME
from deepdanbooru.wording import plural

# The default minimum_tag_count stays while it keeps at least this share of the posts ...
KEEP_DEFAULT_SHARE = 0.5
# ... else the minimum is the largest count that this share of the posts reach.
FITTED_SHARE = 0.9


def database_path_value(database, project_dir) -> str:
    """database_path as project.json resolves it: relative to the project folder."""
    return os.path.relpath(Path(database).resolve(), Path(project_dir).resolve())


def fit_minimum_tag_count(counts, default: int) -> int:
    """The default when it keeps enough posts, else the count FITTED_SHARE of the posts reach (at least 1)."""
    counts = sorted(counts, reverse=True)
    if not counts or sum(count >= default for count in counts) >= KEEP_DEFAULT_SHARE * len(counts):
        return default
    reached = counts[max(0, int(FITTED_SHARE * len(counts)) - 1)]
    return max(1, min(default, reached))


def fit_to_database(database, project_dir) -> tuple[dict, list[str]]:
    """({database_path, minimum_tag_count, image_extensions}, lines saying why)."""
    connection = connect_read_only(database)
    try:
        check_posts_table(connection, database)
        formats = connection.execute("SELECT LOWER(file_ext), COUNT(*) FROM posts GROUP BY LOWER(file_ext)").fetchall()
        rows = connection.execute("SELECT LOWER(file_ext), tag_count_general FROM posts").fetchall()
    except sqlite3.DatabaseError as error:
        raise DatasetError(file_field(database, "posts", f"cannot be read: {error}")) from None
    finally:
        connection.close()
    held = {ext: count for ext, count in formats if ext}
    wider = [ext for ext in IMAGE_EXTENSIONS if ext in held and ext not in DEEPDANBOORU_EXTENSIONS]
    extensions = list(DEEPDANBOORU_EXTENSIONS) + wider
    # Only posts in a format training reads count: a video's tags say nothing about the pictures.
    counts = [count if isinstance(count, int) else 0 for ext, count in rows if ext in extensions]
    if not counts:
        raise DatasetError(file_field(database, "posts", "holds no posts of an image format deepdanbooru trains on "
                                      f"({', '.join(IMAGE_EXTENSIONS)}): import or download some first"))
    default = KEY_BY_NAME["minimum_tag_count"].default
    minimum = fit_minimum_tag_count(counts, default)
    values = {"database_path": database_path_value(database, project_dir), "minimum_tag_count": minimum,
              "image_extensions": extensions}
    def keeps(least):
        return f"{sum(count >= least for count in counts):,}"

    notes = [f"minimum_tag_count: {minimum}: {keeps(minimum)} of {plural(len(counts), 'post')} have at least "
             f"{plural(minimum, 'general tag')}"
             + ("" if minimum == default else f" (the default {default} would keep {keeps(default)})")]
    if wider:
        notes.append(f"image_extensions: {', '.join(extensions)} (the database holds "
                     f"{', '.join(f'{held[ext]:,} {ext}' for ext in wider)})")
    unknown = sorted(ext for ext in held if ext not in IMAGE_EXTENSIONS)
    if unknown:
        notes.append(f"note: {', '.join(f'{held[ext]:,} {ext}' for ext in unknown)} posts are in no format "
                     "deepdanbooru trains on and stay unused")
    return values, notes
