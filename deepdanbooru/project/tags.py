"""tags.txt: the output vocabulary, one tag a line, order = output index."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from deepdanbooru.errors import TagsError, file_field

TAGS_FILE = "tags.txt"


def parse_tags(text: str, source) -> list[str]:
    """Strip each line, skip blanks; empty or duplicated vocabularies are errors."""
    tags: list[str] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        tag = line.strip()
        if not tag:
            continue
        if any(ch.isspace() for ch in tag):
            raise TagsError(file_field(source, f"line {number}",
                                       f"tag {tag!r} contains whitespace; tags in tag_string are space-separated"))
        if tag in first_line:
            raise TagsError(file_field(source, f"line {number}",
                                       f"duplicate tag {tag!r} (first on line {first_line[tag]}); "
                                       "two outputs would alias"))
        first_line[tag] = number
        tags.append(tag)
    if not tags:
        raise TagsError(file_field(source, None, "holds no tags"))
    return tags


def load_tags(path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise TagsError(file_field(path, None, "is a folder, not a file" if path.is_dir() else "not found"))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TagsError(file_field(path, None, f"cannot be read: {error}")) from None
    return parse_tags(text, path)


def tags_hash(tags) -> str:
    """SHA-256 of the vocabulary as the model sees it (order matters; blank lines do not)."""
    return hashlib.sha256("\n".join(tags).encode("utf-8")).hexdigest()


def count_tags(tag_strings, vocabulary: set[str] | None = None, counts: Counter | None = None) -> Counter:
    """Posts each tag occurs in: a tag repeated within one post counts once (tokens split on whitespace,
    as the label pipeline splits them). With `vocabulary`, only its tags are counted, so memory stays
    bounded by it over millions of posts; with `counts`, they are added to it."""
    counts = Counter() if counts is None else counts
    for tag_string in tag_strings:
        tokens = set(tag_string.split())
        counts.update(tokens if vocabulary is None else tokens & vocabulary)
    return counts


def tag_counts(tag_strings, tags) -> list[int]:
    """count_tags for each tag of `tags`, in that order."""
    counts = count_tags(tag_strings, set(tags))
    return [counts[tag] for tag in tags]
