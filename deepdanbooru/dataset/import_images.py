"""import-images: a folder of images with .txt tag sidecars -> a DeepDanbooru dataset.

Writes DATASET/dataset.sqlite (table posts) and DATASET/images/<md5[0:2]>/<md5>.<ext>,
so people with their own pictures can train without any network access.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import sqlite3
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from deepdanbooru.captions import DEFAULT_EXTENSION, caption_extension, caption_separator, parse_caption, read_caption
from deepdanbooru.dataset import duplicates
from deepdanbooru.dataset.build import POSTS_COLUMNS, POSTS_SCHEMA, RATING_TAGS, is_system_tag
from deepdanbooru.dataset.intake import Intake
from deepdanbooru.dataset.records import IMAGES_DIR, REQUIRED_COLUMNS, check_posts_table, image_path
from deepdanbooru.errors import DatasetError, UserError, file_field
from deepdanbooru.fileio import create_beside
from deepdanbooru.formats import DEEPDANBOORU_EXTENSIONS, EXTENSION_BY_PILLOW_NAME, IMAGE_EXTENSIONS
from deepdanbooru.project.config import KEY_BY_NAME, PROJECT_FILE
from deepdanbooru.wording import plural

DATABASE_NAME = "dataset.sqlite"
DEFAULT_EXTENSIONS = IMAGE_EXTENSIONS
RATING_LETTERS = {tag: letter for letter, tag in RATING_TAGS.items()}
LISTED = 20  # skipped files named one by one before the rest are only counted
# kohya's training scripts read captions with "," by default; reading ignores the spaces around a separator, so
# it reads exactly as the ", " evaluate --save-txt writes.
READ_SEPARATOR = ","


class _Unreadable(Exception):
    pass


@dataclass
class ImportSummary:
    database: Path
    imported: int = 0
    first_id: int | None = None
    last_id: int | None = None
    duplicates: list[tuple[Path, str]] = field(default_factory=list)  # (path, what it duplicates)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    untagged: list[tuple[Path, str]] = field(default_factory=list)
    updated: list[tuple[Path, int]] = field(default_factory=list)  # (path, post id) whose caption changed
    malformed: list[tuple[str, str]] = field(default_factory=list)  # tar shards: bad post objects, damaged shards
    few_tags: int = 0
    captions_read: int = 0  # captions read by the separator check's first pass (it ends at the first holding the
    captions_with_separator: int = 0  # mark), those holding it and those read as one tag (_check_separator)
    one_tag: int = 0
    one_tag_example: tuple[str, str] | None = None  # (caption's name, its text)
    wider_formats: dict[str, int] = field(default_factory=dict)  # file_ext -> images not in the default formats


def parse_extensions(text) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    extensions = tuple(dict.fromkeys(item.strip().lower().lstrip(".") for item in items if item.strip()))
    bad = [ext for ext in extensions if ext not in IMAGE_EXTENSIONS]
    if bad or not extensions:
        raise UserError(f"--extensions: {', '.join(bad) or '(empty)'} not supported; "
                        f"choose from {', '.join(IMAGE_EXTENSIONS)}")
    return extensions


def find_sidecar(image: Path, extension: str = DEFAULT_EXTENSION) -> Path | None:
    for candidate in (image.with_suffix(extension), image.with_name(image.name + extension)):
        if candidate.is_file():
            return candidate
    return None


def detect_format(data: bytes) -> str:
    """Decode fully (verify() misses truncated pixel data) and return the file_ext of the real format."""
    try:
        with warnings.catch_warnings():
            # Training treats images above the pixel limit as bad; refuse them here already.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                ext = EXTENSION_BY_PILLOW_NAME.get(image.format)
                if ext is None:
                    raise _Unreadable(f"format {image.format} is not supported for training")
                image.load()
                return ext
    except _Unreadable:
        raise
    except Image.UnidentifiedImageError:
        raise _Unreadable("not an image in a format Pillow knows") from None
    except Exception as error:  # decoders raise OSError, SyntaxError, ValueError, EOFError, bomb errors...
        raise _Unreadable(str(error) or type(error).__name__) from None


def scan(src: Path, extensions, exclude=()) -> list[Path]:
    """Image files under src with a wanted extension, in a stable order; hidden and `exclude` folders skipped."""
    found = []
    for directory, folders, files in os.walk(src):
        folders[:] = sorted(name for name in folders if not name.startswith(".")
                            and not any(_same(Path(directory, name), skip) for skip in exclude))
        for name in files:
            if Path(name).suffix.lower().lstrip(".") in extensions and not name.startswith("."):
                found.append(Path(directory, name))
    return sorted(found, key=lambda path: path.relative_to(src).as_posix())


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class _Placer:
    """Puts image files into images/, remembering what it created so a failure can take it back."""

    def __init__(self, images_dir: Path, link: bool):
        self.images_dir = images_dir
        self.link = link
        self.created_files: list[Path] = []
        self.created_dirs: list[Path] = []

    def place(self, source: Path, data: bytes, md5: str, ext: str) -> None:
        target = Path(image_path(self.images_dir, md5, ext))
        if target.is_file() and target.stat().st_size == len(data):
            return
        for directory in (self.images_dir.parent, self.images_dir, target.parent):
            if not directory.is_dir():
                directory.mkdir()
                self.created_dirs.append(directory)
        if self.link:
            self._link(source, target)
        else:
            self._copy(data, target)
        self.created_files.append(target)

    def _link(self, source: Path, target: Path) -> None:
        if target.exists():
            target.unlink()
        try:
            os.link(source, target)
        except OSError as error:
            raise DatasetError(file_field(source, None, f"cannot be hard-linked into {self.images_dir} ({error}); "
                                          "images on another file system need a copy: drop --link")) from None

    @staticmethod
    def _copy(data: bytes, target: Path) -> None:
        handle, temporary = create_beside(target)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
            os.replace(temporary, target)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def undo(self) -> None:
        for path in reversed(self.created_files):
            try:
                path.unlink()
            except OSError:
                pass
        for directory in reversed(self.created_dirs):
            try:
                directory.rmdir()
            except OSError:
                pass


def _open_existing(database: Path):
    """Columns to fill, the md5s already present (-> post id) and the largest id of an existing dataset database."""
    connection = sqlite3.connect(database)
    try:
        present = check_posts_table(connection, database, REQUIRED_COLUMNS)
        known = {md5: post_id for md5, post_id in connection.execute("SELECT md5, id FROM posts") if md5}
        max_id = connection.execute("SELECT MAX(id) FROM posts").fetchone()[0] or 0
        if not isinstance(max_id, int):
            raise DatasetError(file_field(database, "posts", f"largest id {max_id!r} is not an integer"))
    except sqlite3.DatabaseError as error:
        connection.close()
        raise DatasetError(file_field(database, None, f"not a readable SQLite database: {error}")) from None
    except DatasetError:
        connection.close()
        raise
    columns = tuple(name for name in POSTS_COLUMNS if name in present)
    return connection, columns, known, max_id


def import_images(src, dataset, link: bool = False, extensions=DEFAULT_EXTENSIONS, echo=print,
                  warn=print, group_duplicates: bool = False, project=None,
                  caption_ext: str = DEFAULT_EXTENSION, separator: str = READ_SEPARATOR) -> ImportSummary:
    """Import every image under SRC that has tags into DATASET; returns what was done and skipped.

    An image already in DATASET whose caption now holds other tags gets them (its post is updated).
    A caption file that is not UTF-8 stops the import before anything is written.

    group_duplicates (a new dataset only): near-identical pictures share a
    split_id, so they land on one side of the validation split.
    project: the project the dataset is for, so the closing advice gives database_path as project.json
    resolves it (relative to the project folder).
    separator: the string between tags in the caption files (deepdanbooru.captions' grammar).
    """
    from deepdanbooru.dataset import tar_shards  # SRC may also be tar shards, or folders of them

    extensions = parse_extensions(extensions)
    shards = tar_shards.find_shards(src, extensions, warn, skip=[Path(dataset), Path(dataset) / IMAGES_DIR])
    src, dataset = Path(src if isinstance(src, (str, os.PathLike)) else src[0]), Path(dataset)
    caption_ext = caption_extension(caption_ext)
    separator = caption_separator(separator)
    if shards and link:
        raise UserError("--link: a picture inside a tar shard cannot be hard-linked; drop --link")
    if not src.is_dir() and not shards:
        raise DatasetError(file_field(src, None, "source folder not found"))
    if dataset.exists() and not dataset.is_dir():
        raise DatasetError(file_field(dataset, None, "exists and is not a folder"))
    database = dataset / DATABASE_NAME
    # The dataset may live inside SRC (even be SRC): never re-import its own images.
    images = shards or scan(src, extensions, [path for path in (dataset, dataset / IMAGES_DIR) if path.is_dir()])
    if not images:
        raise DatasetError(file_field(src, None, f"no image files ({', '.join(extensions)}) found"))

    existing = database.exists()
    if existing and group_duplicates:
        raise DatasetError(file_field(database, None, "exists: --group-duplicates applies to a new dataset only "
                                      "(posts already there keep their side of the split)"))
    if existing:
        connection, columns, known, max_id = _open_existing(database)
    else:
        connection, columns, known, max_id = None, POSTS_COLUMNS, {}, 0
    summary = ImportSummary(database)
    # The dataset folder is made by the placer (with the first picture it places), so a failure before
    # anything is written leaves no empty folder behind.
    dataset.parent.mkdir(parents=True, exist_ok=True)
    placer = _Placer(dataset / IMAGES_DIR, link)
    temporary = None
    try:
        query = connection.execute if connection is not None else None
        intake = Intake(known, max_id, placer, summary, query, (detect_format, _Unreadable, _post_values),
                        KEY_BY_NAME["minimum_tag_count"].default)
        if separator_to_check(separator):  # a first pass over the captions, so a refusal writes nothing
            if shards:
                tar_shards.read_captions(shards, extensions, caption_ext, separator, intake.caption)
            else:
                _read_captions(images, caption_ext, separator, intake.caption)
            _check_separator(summary, src, separator)
        if shards:
            rows, updates = tar_shards.collect(shards, intake, caption_ext, separator, extensions)
        else:
            rows, updates = _collect(images, src, intake, caption_ext, separator)
        if not rows and not existing:
            raise DatasetError(file_field(src, None, "no image could be imported "
                                          f"({len(summary.untagged)} without tags, {len(summary.unreadable)} "
                                          f"unreadable, {len(summary.duplicates)} duplicates"
                                          + (f", {len(summary.malformed)} malformed" if summary.malformed else "")
                                          + ")"))
        if connection is None:
            handle, temporary = create_beside(database)
            os.close(handle)
            connection = sqlite3.connect(temporary)
            connection.execute(POSTS_SCHEMA)
        values = [tuple(row[name] for name in columns) for row in rows]
        marks = ", ".join("?" for _ in columns)
        try:
            connection.executemany(f"INSERT INTO posts ({', '.join(columns)}) VALUES ({marks})", values)
            _update_posts(connection, columns, updates)
            if group_duplicates:
                grouped = duplicates.group_duplicates(connection, dataset / IMAGES_DIR)
            connection.commit()
        except sqlite3.DatabaseError as error:
            raise DatasetError(file_field(database, "posts", f"cannot be written: {error}")) from None
        connection.close()
        connection = None
        if temporary:
            os.replace(temporary, database)
            temporary = None
    except BaseException:
        if connection is not None:
            connection.rollback()
            connection.close()
        if temporary:
            for path in (temporary, f"{temporary}-journal"):
                if os.path.exists(path):
                    os.unlink(path)
        placer.undo()
        raise
    if group_duplicates:
        echo(duplicates.describe(grouped))
    _report(summary, dataset, echo, warn, project)
    return summary


def separator_to_check(separator: str) -> bool:
    """Whether _check_separator can refuse `separator`: one with a mark, other than the default's."""
    mark = separator.strip()
    return bool(mark) and mark != READ_SEPARATOR.strip()


def _check_separator(summary: ImportSummary, src: Path, separator: str) -> None:
    """A --caption-separator other than the default that no caption file holds is the wrong one: each caption was
    read as one tag or split at spaces, not at it. Refused, with how many captions it made one tag."""
    mark = separator.strip()
    if not separator_to_check(separator) or not summary.captions_read or summary.captions_with_separator:
        return
    ones, first = summary.one_tag, summary.one_tag_example
    example = f" ({first[0]}: {first[1]!r})" if first else ""
    others = " and the others split at spaces or line breaks" if ones < summary.captions_read else ""
    read_as = (f"{ones:,} of them {'was' if ones == 1 else 'were each'} read as one tag{example}{others}" if ones
               else "each was split at spaces or line breaks instead")
    raise UserError(file_field(src, None, (
        f"--caption-separator {separator!r}: none of the {plural(summary.captions_read, 'caption file')} read holds "
        f"{mark!r}: {read_as}; give the separator your captions use ({READ_SEPARATOR!r} when the option is left "
        "out)")))


def _post_values(tags) -> dict:
    """The posts columns a caption's tags decide."""
    general = [tag for tag in tags if not is_system_tag(tag)]
    rating = next((RATING_LETTERS[tag] for tag in tags if tag in RATING_LETTERS), None)
    return {"tag_string": " ".join(tags), "tag_count_general": len(general), "rating": rating}


def _update_posts(connection, columns, updates: list[tuple[int, dict]]) -> None:
    """New tags for posts already there; a caption without a rating tag keeps the post's rating."""
    rating = ", rating = COALESCE(?, rating)" if "rating" in columns else ""
    for post_id, values in updates:
        extra = (values["rating"],) if rating else ()
        connection.execute(f"UPDATE posts SET tag_string = ?, tag_count_general = ?{rating} WHERE id = ?",
                           (values["tag_string"], values["tag_count_general"], *extra, post_id))


def _read_captions(images, caption_ext: str, separator: str, tally) -> None:
    """A first pass over the caption files _collect will read: each goes to tally(name, text, tags, mark) until it
    returns True (the separator's mark found)."""
    for path in images:
        sidecar = find_sidecar(path, caption_ext)
        if sidecar is not None:
            text = read_caption(sidecar)
            if tally(sidecar.name, text, parse_caption(text, separator), separator.strip()):
                return


def _collect(images, src, intake: Intake, caption_ext: str = DEFAULT_EXTENSION,
             separator: str = READ_SEPARATOR) -> tuple[list[dict], list[tuple[int, dict]]]:
    """(rows to insert, (post id, new values) for known images whose caption changed)."""
    summary = intake.summary
    for path in images:
        sidecar = find_sidecar(path, caption_ext)
        if sidecar is None:
            summary.untagged.append((path, f"no {caption_ext} sidecar"))
            continue
        tags = parse_caption(read_caption(sidecar), separator)
        if not tags:
            summary.untagged.append((path, f"{sidecar.name} holds no tags"))
            continue
        try:
            data = path.read_bytes()
        except OSError as error:
            summary.unreadable.append((path, str(error)))
            continue
        intake.add(path, data, tags, _post_values(tags), path.relative_to(src).as_posix(), path)
    return intake.finish()


def _report(summary: ImportSummary, dataset: Path, echo, warn, project=None) -> None:
    for items, line in ((summary.unreadable, "warning: {}: unreadable image skipped: {}"),
                        (summary.untagged, "warning: {}: skipped: {}"),
                        (summary.duplicates, "note: {}: same bytes as {}, skipped"),
                        (summary.malformed, "warning: {}: {}"),
                        (summary.updated, "note: {}: already in the dataset as post {}; its caption changed, "
                                          "the post's tags are updated")):
        for path, reason in items[:LISTED]:
            warn(line.format(path, reason))
        if len(items) > LISTED:
            warn(f"... and {len(items) - LISTED} more like that")
    ids = f" (ids {summary.first_id}-{summary.last_id})" if summary.imported else ""
    echo(f"Imported {plural(summary.imported, 'image')} into {summary.database}{ids}")
    if summary.updated:
        echo(f"Updated the tags of {plural(len(summary.updated), 'image')} already in the dataset "
             "(their captions changed)")
    echo(f"Skipped: {plural(len(summary.duplicates), 'duplicate')}, {len(summary.unreadable):,} unreadable, "
         f"{len(summary.untagged):,} without tags"
         + (f", {len(summary.malformed):,} malformed" if summary.malformed else ""))
    minimum = KEY_BY_NAME["minimum_tag_count"].default
    config = _project_config(project)
    fix = "in project.json" if config is not None else "(create-project --database sets it)"
    listed = _listed_formats(config) if config is not None else list(DEEPDANBOORU_EXTENSIONS)
    missing = {ext: count for ext, count in summary.wider_formats.items() if ext not in listed}
    if summary.few_tags:
        echo(f"note: {plural(summary.few_tags, 'imported post')} {'has' if summary.few_tags == 1 else 'have'} "
             f"fewer than {minimum} tags, the default minimum_tag_count; lower minimum_tag_count {fix} "
             "to train on them")
    if missing:
        count = sum(missing.values())
        formats = ", ".join(missing)
        echo(f"note: {plural(count, 'imported image')} {'is' if count == 1 else 'are'} {formats}, not png/jpg: "
             f"add {formats} to image_extensions {fix} to train on them")
    for line in next_steps(dataset / DATABASE_NAME, project, [*listed, *missing] if missing else None):
        echo(line)


def _project_config(project) -> Path | None:
    """The project's project.json when it exists already."""
    if project is None:
        return None
    config = Path(project) / PROJECT_FILE
    return config if config.is_file() else None


def _listed_formats(config: Path) -> list[str]:
    """project.json's image_extensions (the default when it cannot be read: the advice is then only a line
    too many)."""
    try:
        listed = json.loads(config.read_text(encoding="utf-8")).get("image_extensions", DEEPDANBOORU_EXTENSIONS)
        return list(dict.fromkeys(str(ext).lower() for ext in listed))
    except (AttributeError, OSError, TypeError, ValueError):
        return list(DEEPDANBOORU_EXTENSIONS)


def next_steps(database: Path, project=None, image_extensions=None) -> list[str]:
    """What to run next: create-project --database when there is no project.json yet, else what to set in it
    (image_extensions too, when given: the imported formats it lacks).

    database_path is resolved against the project folder, not the current one: relative to the
    project when it is known, else absolute.
    """
    name = "PROJECT" if project is None else str(project)
    runs = [f"  deepdanbooru make-tags {name}", f"  deepdanbooru train-project {name}"]
    config = _project_config(project)
    if config is None:
        # create-project --database fills database_path, image_extensions and minimum_tag_count from the posts.
        return ["Next: create the project from the dataset, then run",
                f"  deepdanbooru create-project {name} --database {shlex.quote(str(database))}", *runs]
    value = os.path.relpath(database.resolve(), Path(project).resolve())
    extensions = f" and image_extensions: {json.dumps(image_extensions)}" if image_extensions else ""
    if _points_at(config, Path(project), database):
        if not extensions:
            return [f"Next: {config} uses this dataset already; run", *runs]
        return [f"Next: set{extensions[4:]} in {config}, then run", *runs]
    return [f"Next: set \"database_path\": {json.dumps(value)}{extensions} in {config}, then run", *runs]


def _points_at(config: Path, project: Path, database: Path) -> bool:
    """Whether project.json's database_path is `database` already."""
    try:
        given = json.loads(config.read_text(encoding="utf-8")).get("database_path")
        return isinstance(given, str) and (project / Path(given).expanduser()).resolve() == database.resolve()
    except (AttributeError, OSError, TypeError, ValueError):
        return False
