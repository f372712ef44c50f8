"""deepdanbooru audit PROJECT --apply FILE: accepted suggestions into the posts table (and caption files).

A `missing` row adds its tag to the post, a `wrong` row removes it; a row already in effect changes
nothing, so applying a file twice changes nothing the second time. Every row is checked against
the audit's record (audit/audit.json) before anything is written: a row the audit did not suggest
(a file from another project or database) and a post edited since the audit (its md5, or any tag
the audit did not suggest for it) stop the command, naming them. Then the database is copied to
audit/backups/<time>/ (with every caption file about to change), and the posts are updated in one
transaction: copying the backup back restores the database as it was, hand edits included.

Caption files (--captions FOLDER, the folder import-images read): the picture whose content has the
post's md5 gets the rows' change in its caption file, its other entries kept as written; otherwise a
later import-images would put the caption's tags back. The captions follow the rows whether or not
the database still needs them, so applying the file again with --captions mends the captions of an
apply made without it. A new entry is spelled as the caption spells its multi-word tags, or, in a
caption without one, as the folder's captions do ('travel & places' where they write spaces).

--dry-run lists each change (post, tag, add or remove, caption file) before the totals.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.audit.results import AUDIT_DIR, read_record, read_suggestions
from deepdanbooru.captions import (DEFAULT_EXTENSION, DEFAULT_SEPARATOR, CaptionError, caption_extension,
                                   format_caption, multi_word_spelling, parse_caption, read_caption, read_tag,
                                   split_caption, tag_key, write_tag)
from deepdanbooru.dataset.records import read_only_uri
from deepdanbooru.errors import DatasetError, UserError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.project.categories import GENERAL, RATING_PREFIX, tag_categories
from deepdanbooru.project.config import load_config
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.tags import load_tags
from deepdanbooru.wording import plural

LISTED = 10  # posts named in a refusal before the rest are counted


@dataclass
class Change:
    post_id: int
    tag_string: str
    count_general: int
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


@dataclass
class ApplySummary:
    changes: list[Change]
    rows: int
    in_effect: int  # rows whose change the post already has
    backup: Path | None = None
    captions: list[Path] = field(default_factory=list)
    no_caption: list[int] = field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(len(change.added) for change in self.changes)

    @property
    def removed(self) -> int:
        return sum(len(change.removed) for change in self.changes)


def _listed(items) -> str:
    items = list(items)
    shown = ", ".join(str(item) for item in items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _check_rows(path, rows, record) -> None:
    """Every row must be a suggestion the recorded audit made, for the post as it recorded it."""
    for line, row in rows:
        post = record["posts"].get(str(row.post_id))
        wrong = None
        if post is None or post.get("md5") != row.md5:
            wrong = f"post {row.post_id} with md5 {row.md5}"
        elif row.tag not in post.get("suggested", ()) or (row.tag in post["tags"].split()) != bool(row.given):
            wrong = f"{row.kind} tag {row.tag!r} on post {row.post_id}"
        if wrong:
            raise UserError(file_field(path, f"line {line}", (
                f"{wrong} is not a suggestion of the audit recorded in {ProjectPaths(record['project']).root / AUDIT_DIR}"
                "/audit.json (a file from another project or database, or an older audit?)")))


def _current_posts(database: Path, ids) -> dict:
    try:
        connection = sqlite3.connect(read_only_uri(database), uri=True)
        try:
            rows = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                marks = ", ".join("?" for _ in chunk)
                for post_id, md5, tags, count in connection.execute(
                        f"SELECT id, md5, tag_string, tag_count_general FROM posts WHERE id IN ({marks})", chunk):
                    rows[post_id] = (md5, tags or "", count)
            return rows
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        raise DatasetError(file_field(database, "posts", f"cannot be read: {error}")) from None


def _plan(rows, record, current, database, general) -> tuple[list[Change], int]:
    """The new tags of each post; refuses, naming them, posts edited since the audit."""
    by_post: dict[int, list] = {}
    for _, row in rows:
        by_post.setdefault(row.post_id, []).append(row)
    changed = []
    for post_id in sorted(by_post):
        post = record["posts"][str(post_id)]
        now = current.get(post_id)
        suggested = set(post["suggested"])
        if now is None:
            changed.append(f"{post_id} (gone)")
        elif now[0] != post["md5"]:
            changed.append(f"{post_id} (md5)")
        elif set(now[1].split()) - suggested != set(post["tags"].split()) - suggested:
            changed.append(f"{post_id} (tags)")
    if changed:
        raise DatasetError(file_field(database, "posts", (
            f"{plural(len(changed), 'post')} changed since the audit: {_listed(changed)}; run the audit again")))
    changes, in_effect = [], 0
    for post_id, post_rows in sorted(by_post.items()):
        _, tag_string, count = current[post_id]
        tags = tag_string.split()
        change = Change(post_id, tag_string, count if isinstance(count, int) else 0)
        for row in post_rows:
            if row.given and row.tag in tags:
                tags = [tag for tag in tags if tag != row.tag]
                change.removed.append(row.tag)
            elif not row.given and row.tag not in tags:
                tags.append(row.tag)
                change.added.append(row.tag)
            else:
                in_effect += 1
        if change.added or change.removed:
            delta = sum(general(tag) for tag in change.added) - sum(general(tag) for tag in change.removed)
            change.tag_string = " ".join(tags)
            change.count_general = max(0, change.count_general + delta)
            changes.append(change)
    return changes, in_effect


def edit_caption(text: str, remove, add, separator: str = DEFAULT_SEPARATOR, folder_spaced: bool | None = None) -> str:
    """`text` without the entries of `remove` and with `add` appended, the other entries as written; read and
    written with `separator` (import-images' --caption-separator). With nothing removed the text is kept to
    the character and the new entries follow it, joined as its own entries are.

    New tags are spelled as the caption spells its own multi-word tags ('black background' beside 'white
    background'); a caption without one takes `folder_spaced`, how the folder's other captions spell them
    (True: spaces, False or None: underscores, as the database writes them)."""
    entries, lines = split_caption(text, separator)
    dropped = {tag_key(tag) for tag in remove}
    kept = [entry for entry in entries if tag_key(read_tag(entry, separator)) not in dropped]
    held = {tag_key(read_tag(entry, separator)) for entry in kept}
    with_spaces, with_underscores = multi_word_spelling(entries)
    spaced = with_spaces > 0 and not with_underscores if with_spaces or with_underscores else bool(folder_spaced)
    new = [write_tag(tag, remove_underscore=spaced, separator=separator) for tag in dict.fromkeys(add)
           if tag_key(tag) not in held]
    if len(kept) == len(entries) and not new:
        return text
    joiner = _joiner(text, entries, lines, separator)
    if len(kept) == len(entries):
        body = text.rstrip()
        written = body + joiner + joiner.join(new) if body else joiner.join(new)
    else:
        written = joiner.join(kept + new)
    wanted = list(dict.fromkeys(tag_key(tag) for tag in [read_tag(entry, separator) for entry in kept] + list(add)))
    if [tag_key(tag) for tag in parse_caption(written, separator)] != wanted:
        # e.g. one spaced entry left of a comma list: the plain separated form reads back right whatever it held
        written = format_caption([read_tag(entry, separator) for entry in kept] + list(add), separator=separator)
    if text.endswith("\n") and not written.endswith("\n"):
        written += "\n"
    return written


def _joiner(text: str, entries, lines: bool, separator: str) -> str:
    """How the caption's own entries are joined: a line break, the folder's separator, or the default
    comma as the text writes it (', ' or ','), or a space between space-separated tags."""
    if lines:
        return "\n"
    mark = DEFAULT_SEPARATOR.strip()
    if separator.strip() != mark or len(entries) < 2:  # ',' and ', ' are the one comma separator
        return separator
    if mark not in text:
        return " "
    return DEFAULT_SEPARATOR if DEFAULT_SEPARATOR in text else mark


def _caption_files(folder: Path, extension: str, md5s: set, separator: str) -> tuple[dict, bool | None]:
    """({md5: caption file} for the pictures under `folder` whose content has one of `md5s`, how the folder's
    captions spell multi-word tags: True with spaces, False with underscores, None when none holds one)."""
    from deepdanbooru.dataset.import_images import DEFAULT_EXTENSIONS, find_sidecar, scan

    found, spaced, joined = {}, 0, 0
    for image in scan(folder, DEFAULT_EXTENSIONS):
        sidecar = find_sidecar(image, extension)
        if sidecar is None:
            continue
        try:
            with_spaces, with_underscores = multi_word_spelling(split_caption(read_caption(sidecar), separator)[0])
            spaced, joined = spaced + with_spaces, joined + with_underscores
        except CaptionError:
            pass  # a caption that is not to change may be unreadable; one that is stops the edit when read
        digest = hashlib.md5(image.read_bytes()).hexdigest()
        if digest in md5s and digest not in found:
            found[digest] = sidecar
    return found, (spaced > joined if spaced or joined else None)


@dataclass
class _Listed:
    """One line of a dry run's list: a row's change to the database and to its caption file."""
    post_id: int
    tag: str
    add: bool
    in_database: bool  # the database changes
    caption: Path | None = None  # the caption file that changes for it
    no_caption: bool = False  # --captions given, no caption file found for the post

    def line(self) -> str:
        details = [] if self.in_database else [f"the post already {'has' if self.add else 'lacks'} it"]
        if self.caption is not None:
            details.append(f"caption {self.caption}")
        elif self.no_caption:
            details.append("no caption file")
        return f"post {self.post_id}: {'add' if self.add else 'remove'} {self.tag}" + "".join(
            f"; {detail}" for detail in details)


def _caption_edits(rows, record, folder: Path, extension: str, separator: str, summary, listed: dict) -> list:
    """(caption file, new text) for each post with a row whose caption the rows change, whether or not the
    database still needs the change (a re-apply with --captions mends the captions an earlier apply left)."""
    by_post: dict[int, list] = {}
    for _, row in rows:
        by_post.setdefault(row.post_id, []).append(row)
    md5_of = {int(post_id): post["md5"] for post_id, post in record["posts"].items()}
    files, folder_spaced = _caption_files(folder, extension, {md5_of[post_id] for post_id in by_post}, separator)
    edits = []
    for post_id, post_rows in sorted(by_post.items()):
        entries = {entry.tag: entry for entry in listed.get(post_id, ())}
        sidecar = files.get(md5_of[post_id])
        if sidecar is None:
            summary.no_caption.append(post_id)
            for entry in entries.values():
                entry.no_caption = True
            continue
        text = read_caption(sidecar)
        edited = edit_caption(text, [row.tag for row in post_rows if row.given],
                              [row.tag for row in post_rows if not row.given], separator, folder_spaced)
        if edited == text:
            continue
        edits.append((sidecar, edited))
        before = {tag_key(tag) for tag in parse_caption(text, separator)}
        after = {tag_key(tag) for tag in parse_caption(edited, separator)}
        for row in post_rows:
            if (tag_key(row.tag) in before) == (tag_key(row.tag) in after):
                continue
            if row.tag not in entries:
                entries[row.tag] = _Listed(post_id, row.tag, not row.given, in_database=False)
                listed.setdefault(post_id, []).append(entries[row.tag])
            entries[row.tag].caption = sidecar
    return edits


def apply_audit(project_path, apply_file, *, dry_run: bool = False, captions=None,
                caption_ext: str = DEFAULT_EXTENSION, caption_separator: str = DEFAULT_SEPARATOR,
                echo=print) -> ApplySummary:
    paths = ProjectPaths(project_path)
    config = load_config(paths.root)
    tags = load_tags(paths.tags)
    database = config.require_database()
    record = read_record(paths.root)
    if Path(database).resolve() != Path(record["database"]):
        raise UserError(file_field(paths.root / AUDIT_DIR / "audit.json", "database", (
            f"the audit was made on {record['database']}, but {paths.config} now uses {Path(database).resolve()}; "
            "run the audit again")))
    rows = read_suggestions(apply_file)
    _check_rows(apply_file, rows, record)
    categories = dict(zip(tags, tag_categories(tags, paths.root)))

    def general(tag):
        return not tag.startswith(RATING_PREFIX) and categories.get(tag) in (GENERAL, None)

    current = _current_posts(Path(database), sorted({row.post_id for _, row in rows}))
    changes, in_effect = _plan(rows, record, current, database, general)
    summary = ApplySummary(changes, len(rows), in_effect)
    listed = {change.post_id: [_Listed(change.post_id, tag, False, True) for tag in change.removed]
              + [_Listed(change.post_id, tag, True, True) for tag in change.added] for change in changes}
    caption_edits = []
    if captions is not None:
        folder, extension = Path(captions), caption_extension(caption_ext)
        if not folder.is_dir():
            raise UserError(file_field(folder, None, "--captions folder not found"))
        caption_edits = _caption_edits(rows, record, folder, extension, caption_separator, summary, listed)
    summary.captions = [path for path, _ in caption_edits]
    if dry_run:  # each change, in the file's order, before the totals
        order = {(row.post_id, row.tag): number for number, (_, row) in enumerate(rows)}
        for entry in sorted((entry for entries in listed.values() for entry in entries),
                            key=lambda entry: (entry.post_id, order.get((entry.post_id, entry.tag), 0))):
            echo(entry.line())
    if not dry_run and (changes or caption_edits):
        _check_writable(Path(database), summary.captions)
        summary.backup = _backup(paths.root, Path(database), summary.captions, captions)
        try:
            if changes:
                _write(Path(database), changes)
        except BaseException:
            shutil.rmtree(summary.backup, ignore_errors=True)  # the backup of a change that did not happen
            raise
        for done, (sidecar, edited) in enumerate(caption_edits):
            try:
                write_text_atomic(sidecar, edited)
            except OSError as error:
                raise UserError(file_field(sidecar, None, (
                    f"cannot be written ({error.strerror or error}) after changing {plural(len(changes), 'post')} "
                    f"and writing {done:,} of {len(caption_edits):,} caption files; {summary.backup} holds the "
                    "database and the caption files as they were"))) from None
    _report(summary, apply_file, database, dry_run, echo)
    return summary


def _check_writable(database: Path, caption_files) -> None:
    """Before the backup: everything about to change, and the folders the writes need (SQLite's journal beside
    the database, each caption's new text beside it), can be written; otherwise nothing is changed."""
    places = [(database, "posts"), (database.parent, None)]
    places += [(Path(path), None) for path in caption_files]
    places += [(folder, None) for folder in dict.fromkeys(Path(path).parent for path in caption_files)]
    for path, field in places:
        if not os.access(path, os.W_OK):
            raise UserError(file_field(path, field, "cannot be written (read-only); nothing was changed"))


def _backup(root: Path, database: Path, caption_files, captions_folder) -> Path:
    """audit/backups/<UTC time>/: the database as it is (SQLite's online backup) and the captions to change."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder = root / AUDIT_DIR / "backups" / stamp
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = folder.with_name(f"{stamp}-{suffix}")
    try:
        folder.mkdir(parents=True)
        source = sqlite3.connect(read_only_uri(database), uri=True)
        target = sqlite3.connect(folder / database.name)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        for path in caption_files:
            copy = folder / "captions" / Path(path).relative_to(captions_folder)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy)
    except (OSError, sqlite3.Error) as error:
        shutil.rmtree(folder, ignore_errors=True)
        where = Path(getattr(error, "filename", None) or folder)
        raise UserError(file_field(where, None, (
            f"cannot write the backup ({getattr(error, 'strerror', None) or error}); nothing was changed"))) from None
    return folder


def _write(database: Path, changes) -> None:
    connection = sqlite3.connect(database)
    try:
        with connection:
            connection.executemany("UPDATE posts SET tag_string = ?, tag_count_general = ? WHERE id = ?",
                                   [(c.tag_string, c.count_general, c.post_id) for c in changes])
    except sqlite3.DatabaseError as error:
        raise DatasetError(file_field(database, "posts", f"cannot be written: {error}")) from None
    finally:
        connection.close()


def _report(summary: ApplySummary, apply_file, database, dry_run: bool, echo) -> None:
    verb = "would change" if dry_run else "changed"
    echo(f"{apply_file}: {plural(summary.rows, 'row')}: {verb} {plural(len(summary.changes), 'post')} "
         f"({plural(summary.added, 'tag')} added, {summary.removed:,} removed); "
         f"{summary.in_effect:,} already in effect")
    if summary.captions or summary.no_caption:
        echo(f"Caption files: {verb} {len(summary.captions):,}" + (
            f"; no caption file found for {plural(len(summary.no_caption), 'post')} ({_listed(summary.no_caption)}): "
            "a later import-images would give them their caption's tags again" if summary.no_caption else ""))
    if dry_run:
        echo("Dry run: nothing was changed")
    elif summary.backup is not None:
        echo(f"Backup of the database before the change: {summary.backup / Path(database).name} "
             f"(copy it over {database} to undo{', with the caption files in captions/' if summary.captions else ''})")
    else:
        echo("Nothing to change: no backup made")
