"""The step import-images takes for each picture with tags, whichever road brought it (a folder of pictures with
caption files, or tar shards): a known picture whose tags changed is updated, a repeat is skipped, an unreadable
picture is named, and a new one is placed under its MD5 and becomes a row. Standard library only.
"""

from __future__ import annotations

import hashlib

from deepdanbooru.formats import DEEPDANBOORU_EXTENSIONS

EXISTING = "the existing dataset"  # what a picture already in the dataset is named as, when repeated


class Intake:
    """Rows to insert and (post id, new values) updates, built one picture at a time; problems go to `summary`.

    known: md5 -> post id of the pictures in the dataset already; query: the dataset's connection.execute (None
    for a new dataset); pictures: import-images' own (detect_format, the error it raises, post_values).
    """

    def __init__(self, known: dict, max_id: int, placer, summary, query, pictures, minimum: int):
        self.known, self.max_id, self.placer, self.summary, self.query = known, max_id, placer, summary, query
        self.detect_format, self.unreadable, self.post_values = pictures
        self.minimum = minimum
        self.rows: list[dict] = []
        self.updates: list[tuple[int, dict]] = []
        self.first: dict[str, str] = {}  # md5 -> how the picture first seen with it is named

    def add(self, where, data: bytes, tags: list[str], values: dict, shown: str, source=None) -> None:
        """One picture's bytes and tags. where: how a problem or an update names it; shown: how a later repeat of
        it names it; source: the file the placer may hard-link (None: the bytes are written)."""
        summary, known, first = self.summary, self.known, self.first
        md5 = hashlib.md5(data).hexdigest()
        if md5 in known and md5 not in first and self.query is not None:
            stored = self.query("SELECT tag_string FROM posts WHERE id = ?", (known[md5],)).fetchone()[0] or ""
            if set(stored.split()) != set(tags):
                first[md5] = shown
                self.updates.append((known[md5], values))
                summary.updated.append((where, known[md5]))
                return
        if md5 in known or md5 in first:
            summary.duplicates.append((where, first.get(md5, EXISTING)))
            return
        try:
            ext = self.detect_format(data)
        except self.unreadable as error:
            summary.unreadable.append((where, str(error)))
            return
        self.placer.place(source, data, md5, ext)
        first[md5] = shown
        post_id = self.max_id + len(self.rows) + 1
        self.rows.append({"id": post_id, "md5": md5, "file_ext": ext, **values, "score": None, "is_deleted": 0})
        summary.few_tags += values["tag_count_general"] < self.minimum
        if ext not in DEEPDANBOORU_EXTENSIONS:
            summary.wider_formats[ext] = summary.wider_formats.get(ext, 0) + 1

    def caption(self, name: str, text: str, tags: list[str], mark: str) -> bool:
        """Count one caption read (with its tags) for the separator check: whether it holds the separator's mark
        (returned), and whether it was read as one tag (the first such named by `name`)."""
        summary = self.summary
        held = mark in text
        summary.captions_read += 1
        summary.captions_with_separator += held
        if len(tags) == 1:
            summary.one_tag += 1
            summary.one_tag_example = summary.one_tag_example or (name, text.strip())
        return held

    def finish(self) -> tuple[list[dict], list[tuple[int, dict]]]:
        """(rows, updates); the summary counts the rows and their ids."""
        self.summary.imported = len(self.rows)
        if self.rows:
            self.summary.first_id, self.summary.last_id = self.rows[0]["id"], self.rows[-1]["id"]
        return self.rows, self.updates
