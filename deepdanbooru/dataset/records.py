"""Eligible posts of a DeepDanbooru-layout SQLite database, as lean parallel arrays."""

from __future__ import annotations

import sqlite3
import sys
import urllib.parse
from array import array
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import DatasetError, file_field

REQUIRED_COLUMNS = ("id", "md5", "file_ext", "tag_string", "tag_count_general")
# Optional: the id that decides a post's side of the validation split instead of its own (NULL: its own).
# make-training-database / import-images --group-duplicates give every copy of a picture the same one.
SPLIT_COLUMN = "split_id"
IMAGES_DIR = "images"


@dataclass(frozen=True)
class Records:
    """Eligible rows in id order. Parallel sequences instead of per-row objects keep 1M rows small."""

    database_path: Path
    ids: array  # int64 post ids, ascending
    md5s: list[str]
    file_exts: list[str]  # interned: a handful of distinct strings
    tag_strings: list[str]
    split_ids: array | None = None  # int64 split keys parallel to ids; None: each post's own id

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def images_dir(self) -> Path:
        return self.database_path.parent / IMAGES_DIR

    def path(self, index: int) -> str:
        return image_path(self.images_dir, self.md5s[index], self.file_exts[index])

    def paths(self) -> list[str]:
        root = str(self.images_dir)
        return [image_path(root, md5, ext) for md5, ext in zip(self.md5s, self.file_exts)]

    def subset(self, indices) -> "Records":
        indices = list(indices)
        return Records(
            self.database_path,
            array("q", (self.ids[i] for i in indices)),
            [self.md5s[i] for i in indices],
            [self.file_exts[i] for i in indices],
            [self.tag_strings[i] for i in indices],
            None if self.split_ids is None else array("q", (self.split_ids[i] for i in indices)),
        )

    @property
    def split_keys(self):
        """What scoring.split hashes: the split ids where the database has them, else the post ids."""
        return self.ids if self.split_ids is None else self.split_ids


def image_path(images_dir, md5: str, ext: str) -> str:
    """images/<md5[0:2]>/<md5>.<ext>, the DeepDanbooru rule."""
    return f"{images_dir}/{md5[0:2]}/{md5}.{ext}"


def check_md5(md5, row_id, source) -> str:
    """md5 need not be a hash, but it becomes a file name: refuse anything that could escape images/."""
    if md5 is not None and not isinstance(md5, str):
        raise DatasetError(file_field(source, f"posts row id {row_id}", f"md5 {md5!r} is not text"))
    if md5 is None or not md5.strip():
        raise DatasetError(file_field(source, f"posts row id {row_id}", "md5 is empty"))
    if "/" in md5 or "\\" in md5 or ".." in md5 or "\0" in md5 or md5 != md5.strip():
        raise DatasetError(file_field(source, f"posts row id {row_id}",
                                      f"md5 {md5!r} is not a safe file name (path separators, '..' or spaces)"))
    return md5


def read_only_uri(database_path) -> str:
    """SQLite's URI for opening database_path read-only. The path is percent-encoded: a raw '?' or '#' in a folder
    name would end the path there (SQLite then opened, and created, another file), and a '%' would be decoded."""
    return f"file:{urllib.parse.quote(str(Path(database_path).resolve()), safe='/')}?mode=ro"


def connect_read_only(database_path) -> sqlite3.Connection:
    database_path = Path(database_path)
    if not database_path.is_file():
        raise DatasetError(file_field(database_path, None, "database file not found"))
    try:
        connection = sqlite3.connect(read_only_uri(database_path), uri=True)
        connection.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.DatabaseError as error:
        raise DatasetError(file_field(database_path, None, f"not a readable SQLite database: {error}")) from None
    return connection


def check_posts_table(connection: sqlite3.Connection, source, columns=REQUIRED_COLUMNS) -> set[str]:
    """Raise naming the missing table or columns; return the table's column names."""
    present = {row[1] for row in connection.execute("PRAGMA table_info(posts)")}
    if not present:
        raise DatasetError(file_field(source, "posts", "table not found"))
    missing = [name for name in columns if name not in present]
    if missing:
        raise DatasetError(file_field(source, "posts", f"missing column(s): {', '.join(missing)}"))
    return present


ELIGIBLE_COLUMNS = "id, md5, file_ext, tag_string"


def eligible_where(extensions) -> str:
    """The condition of an eligible row; its parameters are (*extensions, minimum_tag_count)."""
    return f"file_ext IN ({', '.join('?' for _ in extensions)}) AND tag_count_general >= ?"


def eligible_query(extensions, columns: str = ELIGIBLE_COLUMNS, also: str | None = None, ordered: bool = True,
                   limit: int | None = None) -> str:
    """SELECT `columns` of the eligible rows (AND `also`), in id order unless `ordered` is False.

    Parameters: (*extensions, minimum_tag_count), then any `also` needs. Built from its parts, never by
    editing another query's text.
    """
    sql = f"SELECT {columns} FROM posts WHERE {eligible_where(extensions)}"
    if also:
        sql += f" AND {also}"
    if ordered:
        sql += " ORDER BY id"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return sql


def count_eligible(connection, minimum_tag_count: int, extensions) -> int:
    sql = eligible_query(extensions, "COUNT(*)", ordered=False)
    return connection.execute(sql, (*extensions, minimum_tag_count)).fetchone()[0]


def iter_eligible(connection, source, minimum_tag_count: int, extensions, limit: int | None = None):
    """Yield checked (id, md5, file_ext, tag_string) rows in id order."""
    sql = eligible_query(extensions, limit=limit)
    cursor = connection.execute(sql, (*extensions, minimum_tag_count))
    for row_id, md5, ext, tag_string in cursor:
        if not isinstance(row_id, int):
            raise DatasetError(file_field(source, "posts", f"id {row_id!r} is not an integer"))
        check_md5(md5, row_id, source)
        if tag_string is None:
            tag_string = ""
        elif not isinstance(tag_string, str):
            raise DatasetError(file_field(source, f"posts row id {row_id}", "tag_string is not text"))
        yield row_id, md5, ext, tag_string


def split_keys(connection, source=None) -> dict[int, int]:
    """{post id: split id} for rows whose split_id is set; {} when the column does not exist."""
    present = {row[1] for row in connection.execute("PRAGMA table_info(posts)")}
    if SPLIT_COLUMN not in present:
        return {}
    keys = {}
    for row_id, key in connection.execute(f"SELECT id, {SPLIT_COLUMN} FROM posts WHERE {SPLIT_COLUMN} IS NOT NULL"):
        if not isinstance(key, int):
            raise DatasetError(file_field(source, f"posts row id {row_id}",
                                          f"{SPLIT_COLUMN} {key!r} is not an integer"))
        keys[row_id] = key
    return keys


def project_records(config, purpose: str) -> Records:
    """The eligible posts of a project's database (its minimum_tag_count and image_extensions), or one line
    naming the database's posts table when none is left to `purpose` (e.g. "pack", "audit")."""
    database = config.require_database()
    records = load_records(database, config.minimum_tag_count, config.image_extensions)
    if not len(records):
        raise DatasetError(file_field(database, "posts", f"no eligible records to {purpose}"))
    return records


def load_records(database_path, minimum_tag_count: int, extensions=("png", "jpg", "jpeg")) -> Records:
    """All eligible posts, id ascending. Raises DatasetError naming file and table/column/row."""
    database_path = Path(database_path)
    extensions = tuple(extensions)
    connection = connect_read_only(database_path)
    try:
        check_posts_table(connection, database_path)
        ids = array("q")
        md5s: list[str] = []
        exts: list[str] = []
        tag_strings: list[str] = []
        try:
            for row_id, md5, ext, tag_string in iter_eligible(connection, database_path, minimum_tag_count,
                                                              extensions):
                ids.append(row_id)
                md5s.append(md5)
                exts.append(sys.intern(ext))
                tag_strings.append(tag_string)
            keys = split_keys(connection, database_path)
        except sqlite3.DatabaseError as error:
            raise DatasetError(file_field(database_path, "posts", f"cannot be read: {error}")) from None
    finally:
        connection.close()
    split_ids = array("q", (keys.get(row_id, row_id) for row_id in ids)) if keys else None
    return Records(database_path, ids, md5s, exts, tag_strings, split_ids)
