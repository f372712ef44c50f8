"""Danbooru post objects from JSON Lines and Parquet files, as rows of the posts table. Standard library only
(Parquet needs pyarrow, imported when such a file is read).

Two layouts are read: the Danbooru API's (`tag_string`, or where it is absent the per-category
`tag_string_general` ... `tag_string_meta` joined; `tag_count_general`) and the older Danbooru20xx metadata
dumps' (`tags` a list of `{"name", "category"}` objects, numbers as strings). Each post becomes the tuple
(id, md5, file_ext, tag_string, tag_count_general, rating, score, is_deleted) that a SQLite source's posts
row gives, so the same rules apply to every format.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import DatasetError, file_field

SQLITE, JSON, PARQUET = "SQLite", "JSON", "Parquet"
GZIP_MAGIC = b"\x1f\x8b"
SQLITE_MAGIC = b"SQLite format 3\x00"
PARQUET_MAGIC = b"PAR1"
PARQUET_HINT = "pip install 'deepdanbooru[parquet]' (or pip install pyarrow)"

# Danbooru's tag categories, as the API's per-category fields and the Danbooru20xx dumps number them.
CATEGORY_FIELDS = ("tag_string_general", "tag_string_character", "tag_string_copyright", "tag_string_artist",
                   "tag_string_meta")
GENERAL_CATEGORIES = (0, "0", "general")
# The fields a post row is made of; a Parquet file's other columns are not read.
FIELDS = ("id", "md5", "file_ext", "tag_string", *CATEGORY_FIELDS, "tags", "tag_count_general", "rating", "score",
          "is_deleted")
_READ_BYTES = 1 << 20
_PARQUET_BATCH = 8192
_MAX_ITEM = 64 << 20  # a post object larger than this is taken as malformed


def detect_kind(path) -> str:
    """SQLITE, JSON (plain or gzipped) or PARQUET, from the first bytes of the file, whatever its name."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            head = stream.read(64)
        if head.startswith(GZIP_MAGIC):
            with gzip.open(path, "rb") as stream:
                inner = stream.read(64)
            return JSON if _starts_json(inner) else _unknown(path, inner, "gzipped ")
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(file_field(path, None, f"cannot be read: {getattr(error, 'strerror', None) or error}")) \
            from None
    if head.startswith(SQLITE_MAGIC):
        return SQLITE
    if head.startswith(PARQUET_MAGIC):
        return PARQUET
    if _starts_json(head):
        return JSON
    return _unknown(path, head, "")


def _starts_json(head: bytes) -> bool:
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text[:1] in (b"{", b"[")


def _unknown(path: Path, head: bytes, how: str) -> str:
    what = "is empty" if not head else f"starts with {head[:24]!r}"
    raise DatasetError(file_field(path, None, f"not a readable SQLite database, JSON Lines or Parquet file "
                                              f"({how}content {what})"))


@dataclass
class ReadSummary:
    """What reading found besides the rows: ids that are not integers, and which optional fields never occur."""

    non_integer_ids: int = 0
    seen: set = field(default_factory=set)  # of "rating", "is_deleted": the optional fields some post has


def _integer(value):
    """An id or count as Danbooru writes it (a number, or a number in a string in the Danbooru20xx dumps)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text[1:].isdigit() if text[:1] in "+-" else text.isdigit():
            return int(text)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _names(tags, source, where) -> tuple[list[str], int | None]:
    """Tag names of a Danbooru20xx `tags` list and how many are general (None when no object has a category)."""
    names, general, categorised = [], 0, False
    for tag in tags:
        if isinstance(tag, str):
            names.append(tag)
            continue
        name = tag.get("name") if isinstance(tag, dict) else None
        if not isinstance(name, str):
            raise DatasetError(file_field(source, where, f"tags holds {tag!r}, not an object with a name"))
        names.append(name)
        category = tag.get("category")
        if category is not None:
            categorised = True
            general += category in GENERAL_CATEGORIES
    return names, (general if categorised else None)


def post_row(post, source, where, summary: ReadSummary) -> tuple:
    """The posts row of one post object (a mapping); one line naming `where` and the field when it cannot be."""
    if not isinstance(post, dict):
        raise DatasetError(file_field(source, where, f"is not a post object but {type(post).__name__}"))
    if "file_ext" not in post:
        raise DatasetError(file_field(source, where, "post has no file_ext"))
    tag_string, general = post.get("tag_string"), None
    if tag_string is None:
        parts = [post.get(name) for name in CATEGORY_FIELDS]
        tags = post.get("tags")
        if any(part is not None for part in parts):
            bad = next((name for name, part in zip(CATEGORY_FIELDS, parts)
                        if part is not None and not isinstance(part, str)), None)
            if bad:
                raise DatasetError(file_field(source, where, f"{bad} is not text"))
            tag_string = " ".join(part for part in parts if part and part.strip())
            general = len((parts[0] or "").split())
        elif isinstance(tags, (list, tuple)):
            names, general = _names(tags, source, where)
            tag_string = " ".join(name.strip().replace(" ", "_") for name in names if name.strip())
        elif isinstance(tags, str):
            tag_string = tags
        elif tags is not None:
            raise DatasetError(file_field(source, where, f"tags {tags!r} is neither text nor a list"))
        else:
            raise DatasetError(file_field(source, where, "post has no tag_string, tag_string_general ... "
                                                         "tag_string_meta or tags"))
    count = post.get("tag_count_general")
    if count is None and general is None and isinstance(post.get("tag_string_general"), str):
        general = len(post["tag_string_general"].split())
    if count is None:
        count = general
    if count is None and isinstance(tag_string, str):
        # No categories anywhere: every tag but the rating system tags counts as general.
        count = sum(1 for tag in tag_string.split() if not tag.startswith("rating:"))
    elif not isinstance(count, int) or isinstance(count, bool):
        whole = _integer(count)
        count = count if whole is None else whole
    rating, deleted = post.get("rating"), post.get("is_deleted")
    if rating is not None:
        summary.seen.add("rating")
    if deleted is not None:
        summary.seen.add("is_deleted")
    return (_integer(post.get("id")), post.get("md5"), post.get("file_ext"), tag_string, count, rating,
            _integer(post.get("score")), deleted)


class PostFile:
    """Reads a JSON (Lines) or Parquet file of post objects in chunks of rows."""

    def __init__(self, path, kind: str):
        self.path = Path(path)
        self.kind = kind
        self.summary = ReadSummary()
        self.size = max(self.path.stat().st_size, 1)
        self.position = 0  # bytes of the file read so far (compressed bytes for a gzipped file)
        self.total = None  # posts in the file, where it says
        self.last = None  # where the last whole post read stands ("line 12"), for a damaged file's message

    def chunks(self, chunk_size: int, start_id: int, end_id: int):
        """Yield lists of (row, where) with start_id <= id <= end_id; rows whose id is not an integer are
        counted in summary.non_integer_ids."""
        records = self._parquet(chunk_size) if self.kind == PARQUET else self._json()
        chunk = []
        for post, where in records:
            row = post_row(post, self.path, where, self.summary)
            row_id = row[0]
            if row_id is None:
                self.summary.non_integer_ids += 1
                continue
            if start_id <= row_id <= end_id:
                chunk.append((row, where))
                if len(chunk) >= chunk_size:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    # --- JSON ---

    def _json(self):
        with open(self.path, "rb") as raw:
            compressed = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
            try:
                if _peek_first(stream) == b"[":
                    yield from self._values(stream, raw, array=True)
                elif not _first_line_is_json(stream):
                    # One pretty-printed post object, or several: not one a line.
                    yield from self._values(stream, raw, array=False)
                else:
                    yield from self._lines(stream, raw)
            except (EOFError, gzip.BadGzipFile, zlib.error) as error:
                after = f"after {self.last}" if self.last else "before its first post"
                raise DatasetError(file_field(self.path, None, f"is truncated or damaged {after} ({error})")) \
                    from None
            self.position = self.size

    def _lines(self, stream, raw):
        """JSON Lines: one post object a line (blank lines skipped)."""
        for number, line in enumerate(stream, 1):
            if number % 4096 == 0:
                self.position = raw.tell()
            if not line.strip():
                continue
            where = f"line {number}"
            try:
                post = json.loads(line)
            except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
                reason = f"is not a JSON object: {short_reason(error)}"
                raise DatasetError(file_field(self.path, where, reason)) from None
            self.last = where
            yield post, where

    def _values(self, stream, raw, array: bool):
        """The items of a top-level JSON array (array), or JSON values one after another, decoded one at a time
        so the file is never held whole."""
        decoder = json.JSONDecoder()
        state = {"buffer": "", "at": 0, "pending": b""}
        number, kind = 0, "item" if array else "object"

        read = getattr(stream, "read1", stream.read)  # read1: what a damaged gzip gave before its end is kept

        def more() -> bool:
            block = read(_READ_BYTES)
            self.position = raw.tell()
            if not block:
                return False
            data = state["pending"] + block
            try:
                text, state["pending"] = data.decode("utf-8"), b""
            except UnicodeDecodeError as error:
                if error.start < len(data) - 3:  # not a character cut at the end of the block
                    raise DatasetError(file_field(self.path, f"{kind} {number + 1}", "is not UTF-8 text")) from None
                text, state["pending"] = data[:error.start].decode("utf-8"), data[error.start:]
            state["buffer"] = state["buffer"][state["at"]:] + text
            state["at"] = 0
            return True

        def next_char() -> str:
            """The next non-blank character (consumed), or '' at the end of the file."""
            while True:
                buffer, at = state["buffer"], state["at"]
                while at < len(buffer) and buffer[at] in " \t\r\n\ufeff":
                    at += 1
                state["at"] = at
                if at < len(buffer):
                    state["at"] = at + 1
                    return buffer[at]
                if not more():
                    return ""

        if array and next_char() != "[":
            raise DatasetError(file_field(self.path, None, "is not a JSON array"))
        while True:
            char = next_char()
            if char == "]" and array:
                break
            if not char and not array:
                break
            if array and number and char == ",":
                char = next_char()
            elif array and number:
                raise DatasetError(file_field(self.path, f"item {number + 1}",
                                              f"expected ',' or ']' after item {number}, not {char or 'the end'!r}"))
            if not char:
                raise DatasetError(file_field(self.path, None, f"ends inside its JSON array after item {number}"))
            state["at"] -= 1
            while True:
                try:
                    post, end = decoder.raw_decode(state["buffer"], state["at"])
                    break
                except ValueError as error:
                    # An item cut by the end of a block continues in the next one; one that cannot end is bad.
                    if len(state["buffer"]) - state["at"] > _MAX_ITEM or not more():
                        raise DatasetError(file_field(self.path, f"{kind} {number + 1}",
                                                      f"is not a JSON object: {short_reason(error)}")) from None
            state["at"] = end
            number += 1
            self.last = f"{kind} {number}"
            yield post, self.last

    # --- Parquet ---

    def _parquet(self, chunk_size: int):
        try:
            import pyarrow
            import pyarrow.parquet as parquet
        except ImportError:
            raise DatasetError(file_field(self.path, None, f"is a Parquet file: reading it needs pyarrow; "
                                                            f"{PARQUET_HINT}")) from None
        try:
            # Read as a stream through a 1 MiB buffer: pre-buffering fetches a row group's column chunks whole
            # first (190 MiB more at the peak for 1,000,000 posts in row groups of 100,000, no faster).
            table = parquet.ParquetFile(self.path, pre_buffer=False, buffer_size=_READ_BYTES)
            names = parquet_columns(table.schema_arrow.names)
            self.total = table.metadata.num_rows
            number = 0
            # Small batches: each becomes Python objects at once; the chunk of rows is gathered in chunks().
            for batch in table.iter_batches(batch_size=min(chunk_size, _PARQUET_BATCH), columns=names):
                columns = [batch.column(name).to_pylist() for name in names]
                for values in zip(*columns):
                    number += 1
                    yield dict(zip(names, values)), f"row {number}"
                self.position = int(self.size * number / max(self.total, 1))
        except (pyarrow.ArrowException, OSError) as error:
            reason = f"cannot be read as Parquet: {short_reason(error)}"
            raise DatasetError(file_field(self.path, None, reason)) from None


def parquet_columns(present) -> list[str]:
    """The columns post_row reads from a table with these columns: the category fields or the tags list only where
    tag_string is absent, tag_string_general for the general count only where tag_count_general is absent."""
    present = set(present)
    wanted = {"id", "md5", "file_ext", "tag_count_general", "rating", "score", "is_deleted"}
    if "tag_string" in present:
        wanted.add("tag_string")
        if "tag_count_general" not in present:
            wanted.add("tag_string_general")
    elif present & set(CATEGORY_FIELDS):
        wanted.update(CATEGORY_FIELDS)
    else:
        wanted.add("tags")
    return [name for name in FIELDS if name in wanted and name in present]


def _first_line_is_json(stream) -> bool:
    """Whether the first non-blank line in the stream's buffer is a whole JSON value (so: JSON Lines)."""
    head = stream.peek(1 << 16) if hasattr(stream, "peek") else b""
    for line in head.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        if line.strip():
            try:
                json.loads(line)
                return True
            except ValueError:
                return False
    return True


def _peek_first(stream) -> bytes:
    """The first non-blank byte of the stream, leaving the stream where it was."""
    head = stream.peek(256) if hasattr(stream, "peek") else b""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text[:1]


def short_reason(error) -> str:
    """The first line of an error, the position of a JSON error as a character number, at most 160 characters."""
    if isinstance(error, json.JSONDecodeError):
        # Some of json's messages end in "at" already ("Unterminated string starting at").
        text = f"{error.msg}{'' if error.msg.endswith(' at') else ' at'} character {error.pos + 1}"
    else:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def progress_text(reader: PostFile, read: int) -> str:
    share = f" ({100 * reader.position / reader.size:.0f}% of the file)" if reader.position else ""
    total = f" of {reader.total:,}" if reader.total else ""
    return f"read {read:,}{total} posts{share}"

