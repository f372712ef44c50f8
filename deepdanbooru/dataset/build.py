"""make-training-database and make-tags. Standard library only.

make-training-database copies a Danbooru-style posts table into a training
database (rating system tags appended, deleted posts dropped); make-tags
derives tags.txt from the posts a project will actually train on.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.dataset.post_files import SQLITE, PostFile, detect_kind, progress_text
from deepdanbooru.dataset.records import (
    IMAGES_DIR,
    REQUIRED_COLUMNS,
    check_md5,
    check_posts_table,
    connect_read_only,
    load_records,
)
from deepdanbooru.errors import ConfigError, DatasetError, TagsError, UserError, file_field
from deepdanbooru.project.config import load_config
from deepdanbooru.fileio import create_beside, write_text_atomic
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.split import in_validation
from deepdanbooru.project.tags import count_tags
from deepdanbooru.project.trained import write_tags_file
from deepdanbooru.wording import plural

RATING_TAGS = {
    "g": "rating:general",
    "s": "rating:sensitive",
    "q": "rating:questionable",
    "e": "rating:explicit",
}
SYSTEM_TAGS = tuple(RATING_TAGS.values())
SYSTEM_TAG_PREFIX = "rating:"

OPTIONAL_COLUMNS = ("rating", "score", "is_deleted")
POSTS_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
POSTS_SCHEMA = (
    "CREATE TABLE posts (id INTEGER NOT NULL PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
    "tag_count_general INTEGER, rating TEXT, score INTEGER, is_deleted INTEGER)"
)
INSERT_POST = f"INSERT INTO posts ({', '.join(POSTS_COLUMNS)}) VALUES ({', '.join('?' for _ in POSTS_COLUMNS)})"

# SQLite integers are signed 64-bit; a larger --end-id would not bind.
MAX_ID = 2**63 - 1
DEFAULT_CHUNK_SIZE = 100_000


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


# --- make-training-database ---


@dataclass
class CopySummary:
    copied: int = 0
    skipped_deleted: int = 0
    skipped_bad_md5: int = 0
    first_bad_md5_id: int | None = None
    unknown_rating: int = 0
    ratings: Counter = field(default_factory=Counter)


def is_deleted_value(value) -> bool:
    """Dumps store is_deleted as 0/1, as 'true'/'false' text, or leave it NULL."""
    if value is None:
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "t", "true", "yes", "y")
    return bool(value)


def with_rating_tag(tag_string, rating) -> tuple[str, str | None]:
    """tag_string plus the rating system tag; an already present one is not added twice."""
    tags = tag_string if isinstance(tag_string, str) else ("" if tag_string is None else str(tag_string))
    tag = RATING_TAGS.get(rating.strip().lower()) if isinstance(rating, str) else None
    if tag is None or (tag in tags and tag in tags.split()):  # the substring test spares most splits
        return tags, tag
    return (f"{tags.rstrip()} {tag}" if tags.strip() else tag), tag


def same_file(a: Path, b: Path) -> bool:
    """True for the same file under another spelling, through a symlink or a hard link."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _id_is_integer_key(connection) -> bool:
    """An INTEGER PRIMARY KEY id is unique and always an integer, so the slower checks can be skipped."""
    info = list(connection.execute("PRAGMA table_info(posts)"))
    keys = [row for row in info if row[5]]
    return len(keys) == 1 and keys[0][1] == "id" and (keys[0][2] or "").upper() == "INTEGER"


def _check_ids(connection, source, start_id, end_id) -> int:
    """Refuse duplicate ids (they would collide in the output key); return how many ids are not integers."""
    duplicate = connection.execute(
        "SELECT id FROM posts WHERE id >= ? AND id <= ? GROUP BY id HAVING COUNT(*) > 1 ORDER BY id LIMIT 1",
        (start_id, end_id)).fetchone()
    if duplicate:
        raise DatasetError(file_field(source, f"posts row id {duplicate[0]}", "id occurs more than once"))
    return connection.execute("SELECT COUNT(*) FROM posts WHERE typeof(id) != 'integer'").fetchone()[0]


def _remove_quietly(*paths) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fsync(path) -> None:
    with open(path, "rb") as stream:
        os.fsync(stream.fileno())


def make_training_database(source, output, start_id: int = 1, end_id: int = MAX_ID, use_deleted: bool = False,
                           chunk_size: int = DEFAULT_CHUNK_SIZE, overwrite: bool = False, vacuum: bool = False,
                           echo=print, progress=_stderr, group_duplicates: bool = False) -> CopySummary:
    """Copy posts with start_id <= id <= end_id from SOURCE into a new OUTPUT database.

    The output is built in a temporary file beside OUTPUT and renamed into place
    at the end, so a failed or interrupted run leaves no half database (and an
    old OUTPUT untouched). group_duplicates: identical and near-identical
    pictures share a split_id (dataset/duplicates.py), read from the images
    folder beside OUTPUT, else beside SOURCE.
    """
    source, output = Path(source), Path(output)
    end_id = min(end_id, MAX_ID)
    if chunk_size < 1:
        raise UserError(f"--chunk-size must be >= 1, got {chunk_size}")
    if start_id > end_id:
        raise UserError(f"--start-id {start_id} is greater than --end-id {end_id}")
    if same_file(source, output):
        raise DatasetError(file_field(output, None, f"is the source database {source}; choose another OUTPUT"))
    if output.is_dir():
        raise DatasetError(file_field(output, None, "is a directory; OUTPUT must be a file path"))
    if output.exists() and not overwrite:
        raise DatasetError(file_field(output, None, "already exists; use --overwrite to replace it"))

    kind = detect_kind(source) if source.is_file() else SQLITE
    if kind != SQLITE:
        summary = _from_post_file(PostFile(source, kind), source, output, start_id, end_id, use_deleted,
                                  chunk_size, vacuum, progress, echo, group_duplicates)
    else:
        summary = _from_sqlite(source, output, start_id, end_id, use_deleted, chunk_size, vacuum, progress, echo,
                               group_duplicates)

    skipped = [f"{summary.skipped_deleted} deleted" if summary.skipped_deleted else "",
               f"{summary.skipped_bad_md5} with an empty or unsafe md5 (first: id {summary.first_bad_md5_id})"
               if summary.skipped_bad_md5 else ""]
    skipped = [text for text in skipped if text]
    echo(f"Wrote {plural(summary.copied, 'post')} to {output}"
         + (f" (skipped {', '.join(skipped)})" if skipped else ""))
    if summary.ratings or summary.unknown_rating:
        counts = ", ".join(f"{tag} {summary.ratings[tag]}" for tag in SYSTEM_TAGS if summary.ratings[tag])
        unknown = f"; {summary.unknown_rating} without a g/s/q/e rating" if summary.unknown_rating else ""
        echo(f"Rating tags: {counts or 'none'}{unknown}")
    return summary


def _from_sqlite(source, output, start_id, end_id, use_deleted, chunk_size, vacuum, progress, echo,
                 group_duplicates) -> CopySummary:
    connection = connect_read_only(source)
    try:
        present = check_posts_table(connection, source)
        missing = [name for name in ("rating", "is_deleted") if name not in present]
        if "rating" in missing:
            progress(f"note: {source}: posts has no rating column; no rating system tags are added")
        if "is_deleted" in missing:
            progress(f"note: {source}: posts has no is_deleted column; every post counts as not deleted")
        try:
            if not _id_is_integer_key(connection):
                non_integer = _check_ids(connection, source, start_id, end_id)
                if non_integer:
                    progress(f"warning: {source}: {non_integer} posts row(s) with a non-integer id are skipped")
            total = connection.execute("SELECT COUNT(*) FROM posts WHERE id >= ? AND id <= ? "
                                       "AND typeof(id) = 'integer'", (start_id, end_id)).fetchone()[0]
        except sqlite3.DatabaseError as error:
            raise DatasetError(file_field(source, "posts", f"cannot be read: {error}")) from None
        optional = ", ".join(name if name in present else "NULL" for name in OPTIONAL_COLUMNS)
        select = (f"SELECT {', '.join(REQUIRED_COLUMNS)}, {optional} FROM posts "
                  "WHERE id >= ? AND id <= ? AND typeof(id) = 'integer' ORDER BY id LIMIT ?")


        def copy(temporary):
            return _copy(connection, source, select, temporary, output, start_id, end_id, use_deleted, chunk_size,
                         total, vacuum, progress)

        return _build(output, source, copy, group_duplicates, echo, progress)
    finally:
        connection.close()


def _from_post_file(reader, source, output, start_id, end_id, use_deleted, chunk_size, vacuum, progress, echo,
                    group_duplicates) -> CopySummary:
    def copy(temporary):
        return _copy_posts(reader, source, temporary, output, use_deleted, chunk_size, start_id, end_id, vacuum,
                           progress)

    summary = _build(output, source, copy, group_duplicates, echo, progress)
    if reader.summary.non_integer_ids:
        progress(f"warning: {source}: {reader.summary.non_integer_ids} post(s) with a non-integer id are skipped")
    if "rating" not in reader.summary.seen:
        progress(f"note: {source}: no post has a rating; no rating system tags are added")
    if "is_deleted" not in reader.summary.seen:
        progress(f"note: {source}: no post has is_deleted; every post counts as not deleted")
    return summary


def _build(output, source, copy, group_duplicates, echo, progress) -> CopySummary:
    """copy(temporary) fills a temporary file beside OUTPUT, which replaces OUTPUT only when all went well."""
    output.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = create_beside(output)
    os.close(handle)
    try:
        summary = copy(temporary)
        if group_duplicates:
            _group(temporary, output, source, echo, progress)
        _fsync(temporary)
        os.replace(temporary, output)
    except BaseException:
        _remove_quietly(temporary, f"{temporary}-journal")
        raise
    return summary


def _group(temporary, output, source, echo, progress) -> None:
    from deepdanbooru.dataset import duplicates

    folders = [Path(output).parent / IMAGES_DIR, Path(source).parent / IMAGES_DIR]
    images = next((folder for folder in folders if folder.is_dir()), None)
    if images is None:
        raise DatasetError(file_field(folders[0], None, "--group-duplicates reads the images: no images folder "
                                      f"beside OUTPUT or beside SOURCE ({folders[1]})"))
    progress(f"grouping duplicates: reading the images in {images} ...")
    target = sqlite3.connect(temporary)
    try:
        summary = duplicates.group_duplicates(target, images)
        target.commit()
    finally:
        target.close()
    echo(duplicates.describe(summary))


def _copy(connection, source, select, temporary, output, start_id, end_id, use_deleted, chunk_size, total,
          vacuum, progress) -> CopySummary:
    summary = CopySummary()
    with _target(temporary, vacuum, progress) as target:
        next_id, read = start_id, 0
        while next_id <= end_id:
            try:
                rows = connection.execute(select, (next_id, end_id, chunk_size)).fetchall()
            except sqlite3.DatabaseError as error:
                raise DatasetError(file_field(source, "posts", f"cannot be read: {error}")) from None
            if not rows:
                break
            batch = _convert(rows, source, use_deleted, summary)
            try:
                target.executemany(INSERT_POST, batch)
                target.commit()
            except sqlite3.DatabaseError as error:
                raise DatasetError(file_field(output, None, f"cannot be written: {error}")) from None
            read += len(rows)
            if total > chunk_size:
                progress(f"read {read:,} of {total:,} posts ({100 * read / total:.0f}%), "
                         f"up to id {rows[-1][0]}")
            if len(rows) < chunk_size:
                break
            next_id = rows[-1][0] + 1
    return summary


@contextlib.contextmanager
def _target(temporary, vacuum, progress):
    """The temporary database the posts go into: vacuumed (with --vacuum) once every post is in, closed always."""
    target = sqlite3.connect(temporary)
    try:
        # The temporary file is thrown away on any failure, so a journal buys nothing.
        target.execute("PRAGMA journal_mode=OFF")
        target.execute("PRAGMA synchronous=OFF")
        target.execute(POSTS_SCHEMA)
        yield target
        if vacuum:
            progress("vacuum ...")
            target.execute("VACUUM")
    finally:
        target.close()


def _copy_posts(reader, source, temporary, output, use_deleted, chunk_size, start_id, end_id, vacuum,
                progress) -> CopySummary:
    """The posts of a JSON or Parquet file (post_files.PostFile), chunk by chunk, into the temporary database."""
    summary = CopySummary()
    with _target(temporary, vacuum, progress) as target:
        read = 0
        for chunk in reader.chunks(chunk_size, start_id, end_id):
            batch = _convert([row for row, _ in chunk], source, use_deleted, summary)
            before = target.total_changes
            try:
                target.executemany(INSERT_POST, batch)
                target.commit()
            except sqlite3.IntegrityError:
                # executemany stops at the first row whose id is taken; the rows before it went in.
                failed = batch[target.total_changes - before][0]
                raise DatasetError(_duplicate_line(source, chunk, batch, target.total_changes - before,
                                                   failed)) from None
            except sqlite3.DatabaseError as error:
                raise DatasetError(file_field(output, None, f"cannot be written: {error}")) from None
            read += len(chunk)
            if len(chunk) == chunk_size:
                progress(progress_text(reader, read))
    return summary


def _duplicate_line(source, chunk, batch, index, post_id) -> str:
    """One line naming where the second post with `post_id` stands in the file."""
    earlier = sum(1 for row in batch[:index] if row[0] == post_id)  # 0: its twin came in an earlier chunk
    places = [where for row, where in chunk if row[0] == post_id]
    where = places[min(earlier, len(places) - 1)] if places else "a post"
    return file_field(source, where, f"post id {post_id} occurs more than once")


def _convert(rows, source, use_deleted, summary: CopySummary) -> list[tuple]:
    batch = []
    for row_id, md5, file_ext, tag_string, tag_count, rating, score, deleted in rows:
        if not use_deleted and is_deleted_value(deleted):
            summary.skipped_deleted += 1
            continue
        try:
            check_md5(md5, row_id, source)
        except DatasetError:
            # Real dumps hold a few posts with a hidden (NULL) md5; they have no image to train on.
            summary.skipped_bad_md5 += 1
            if summary.first_bad_md5_id is None:
                summary.first_bad_md5_id = row_id
            continue
        if tag_string is not None and not isinstance(tag_string, str):
            # make-tags and train-project refuse it too; str() would copy "b'...'" as the post's tags
            raise DatasetError(file_field(source, f"posts row id {row_id}", "tag_string is not text"))
        if isinstance(tag_count, (str, bytes)):
            raise DatasetError(file_field(source, f"posts row id {row_id}",
                                          f"tag_count_general {tag_count!r} is not a number"))
        tag_string, tag = with_rating_tag(tag_string, rating)
        if tag:
            summary.ratings[tag] += 1
        else:
            summary.unknown_rating += 1
        deleted_flag = None if deleted is None else int(is_deleted_value(deleted))
        batch.append((row_id, md5, file_ext, tag_string, tag_count, rating, score, deleted_flag))
        summary.copied += 1
    return batch


# --- make-tags ---


def is_system_tag(tag: str) -> bool:
    return tag.startswith(SYSTEM_TAG_PREFIX)


def _system_order(tag: str) -> int:
    return SYSTEM_TAGS.index(tag) if tag in SYSTEM_TAGS else len(SYSTEM_TAGS)


def rank_tags(counts: Counter, min_count: int = 1, limit: int = 0, system_tags: bool = True) -> list[str]:
    """Most frequent first (ties by name), at most `limit` (0: all); rating:* tags last, outside the limit."""
    regular = sorted((tag for tag, n in counts.items() if n >= min_count and not is_system_tag(tag)),
                     key=lambda tag: (-counts[tag], tag))
    if limit:
        regular = regular[:limit]
    system = []
    if system_tags:
        system = sorted((tag for tag, n in counts.items() if n >= min_count and is_system_tag(tag)),
                        key=lambda tag: (_system_order(tag), -counts[tag], tag))
    return regular + system


# All make-tags reads of project.json: a bad model name or batch size must not stop it.
MAKE_TAGS_KEYS = ("database_path", "minimum_tag_count", "image_extensions", "validation_fraction", "seed")


def training_tag_strings(records, validation_fraction: float, seed: int) -> list[str]:
    """The tag strings of the posts train-project trains on: the eligible posts outside the validation split."""
    if validation_fraction <= 0:
        return list(records.tag_strings)
    return [tag_string for key, tag_string in zip(records.split_keys, records.tag_strings)
            if not in_validation(key, validation_fraction, seed)]


def make_tags(project_dir, minimum_post_count: int = 1, limit: int = 0, overwrite: bool = False, save_path=None,
              system_tags: bool = True, allow_trained: bool = False, echo=print) -> list[str]:
    """Write tags.txt from the tag frequencies of the project's training posts.

    Counted over the posts train-project learns from (the eligible posts outside the validation split), so a
    tag kept by --minimum-post-count N has N training positives, as the warnings of preflight and
    train-project count them. Replacing the tags.txt that the project's checkpoints or exported models were
    trained with needs allow_trained, and keeps the old file beside it.
    """
    if minimum_post_count < 1:
        raise UserError(f"--minimum-post-count must be >= 1, got {minimum_post_count}")
    if limit < 0:
        raise UserError(f"--limit must be >= 0, got {limit}")
    config = load_config(project_dir, uses=MAKE_TAGS_KEYS)
    database = config.require_database()
    paths = ProjectPaths(project_dir)
    target = Path(save_path) if save_path else paths.tags
    if target.is_dir():
        raise TagsError(file_field(target, None, "is a directory; give a file path"))
    if not target.parent.is_dir():
        raise TagsError(file_field(target, None, f"directory {target.parent} does not exist"))
    if target.exists() and not overwrite:
        raise TagsError(file_field(target, None, "already exists; use --overwrite to replace it"))
    if target.exists() and target.resolve() != paths.tags.resolve():
        _check_tag_list(target, (config.config_path, database))

    records = load_records(database, config.minimum_tag_count, config.image_extensions)
    if not len(records):
        raise DatasetError(file_field(database, "posts",
                                      f"no eligible posts (file_ext in {', '.join(config.image_extensions)} and "
                                      f"tag_count_general >= {config.minimum_tag_count}, minimum_tag_count in "
                                      f"{config.config_path})"))
    training = training_tag_strings(records, config.validation_fraction, config.seed)
    if not training:
        raise ConfigError(file_field(config.config_path, "validation_fraction",
                                     f"leaves no training posts out of {len(records)} eligible; lower it"))
    counted = (f"{len(training)} training posts (the {len(records)} eligible less the "
               f"{len(records) - len(training)} of the validation split, validation_fraction "
               f"{config.validation_fraction:g})" if config.validation_fraction > 0 else
               f"{len(training)} eligible posts")
    counts = count_tags(training)
    tags = rank_tags(counts, minimum_post_count, limit, system_tags)
    if not tags:
        raise TagsError(file_field(target, None,
                                   f"not written: no tag occurs in {minimum_post_count} or more of the "
                                   f"{counted} of {database}; lower --minimum-post-count"))
    trained, kept = write_tags_file(target, "".join(f"{tag}\n" for tag in tags), paths, allow_trained)

    total_posts = _count_posts(database)
    n_system = sum(1 for tag in tags if is_system_tag(tag))
    echo(f"Wrote {plural(len(tags), 'tag')} ({n_system} rating system tags) to {target}")
    echo(f"from {len(records)} eligible of {total_posts} posts in {database} "
         f"(minimum_tag_count {config.minimum_tag_count}); {len(counts)} distinct tags seen")
    echo(f"counts are over the {counted}")
    top = [tag for tag in tags if not is_system_tag(tag)][:5]
    if top:
        echo("most frequent: " + ", ".join(f"{tag} ({counts[tag]})" for tag in top))
    if kept is not None:
        echo(f"Kept the previous tags.txt as {kept}: {trained.describe()} were trained with it")
        if trained.checkpoints is not None:
            echo(f"train-project refuses to resume from {trained.checkpoints} with the new tags: move that folder "
                 f"away to start fresh, or put {kept.name} back as {target.name} to resume")
    return tags


# The largest file taken for a tag list --overwrite may replace (a 100,000-tag list is about 2 MB).
_TAG_LIST_BYTES = 16 << 20


def _check_tag_list(target: Path, own_files) -> None:
    """--overwrite with --save-path replaces another tag list, never the project's own files or a file of another
    kind (a model, an image, JSON)."""
    if any(target.resolve() == Path(own).resolve() for own in own_files):
        reason = "it is one of the project's own files"
    elif target.suffix.lower() in (".csv", ".json"):  # a thresholds.csv has one comma-joined word a line too
        reason = "it is not a tag list (one tag a line)"
    else:
        with open(target, "rb") as handle:
            data = handle.read(_TAG_LIST_BYTES + 1)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if len(data) > _TAG_LIST_BYTES or text is None or "\0" in text or text.lstrip()[:1] in ("{", "[") or \
                any(len(line.split()) != 1 for line in lines):
            reason = "it is not a tag list (one tag a line)"
        else:
            return
    raise TagsError(file_field(target, None, f"not replaced: {reason}; --overwrite replaces only a tag list: give "
                                             "another --save-path"))


def _count_posts(database) -> int:
    connection = connect_read_only(database)
    try:
        return connection.execute("SELECT COUNT(*) FROM posts").fetchone()[0]
    finally:
        connection.close()
