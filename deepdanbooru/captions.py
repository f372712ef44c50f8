"""Caption files, the text files beside images that captioning and tagging tools read and write.

Standard library only: import-images reads them, evaluate --save-txt writes them.
"""

from __future__ import annotations

import re
from pathlib import Path

from deepdanbooru.errors import UserError, file_field

DEFAULT_EXTENSION = ".txt"
# A prompt weight, `(masterpiece:1.2)` or `[tag:0.8]`: the tag is what stands before the colon.
# Escaped brackets (`\(`) belong to the tag, so weights are stripped before escapes are undone.
_WEIGHTED = re.compile(r"^[(\[{]+(?P<tag>.*?):\s*-?\d+(?:\.\d*)?[)\]}]*$|^[(\[{]+(?P<bare>[^:()\[\]{}]*)[)\]}]+$")


class CaptionError(UserError):
    """A caption file cannot be read, or would replace a file the user wrote."""


def caption_extension(text: str, option: str = "--caption-extension") -> str:
    """'.caption' or 'caption' -> '.caption'; refuses what is not a plain file-name suffix."""
    value = "." + text.strip().lstrip(".")
    if value == "." or any(char in value for char in "/\\*?") or value.strip(".") != value[1:]:
        raise CaptionError(f"{option}: {text!r} is not a file-name extension (such as .txt or .caption)")
    return value


def read_caption(path) -> str:
    """The text of a caption file; one line naming the file when it is not UTF-8 or cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise CaptionError(file_field(path, None, f"cannot be read: {error.strerror or error}")) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CaptionError(file_field(path, None, f"is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                                      f"{error.start}); save it as UTF-8")) from None


def tag_key(tag: str) -> str:
    """What two spellings of one tag share: 'Long_Hair' and 'long hair' are the same tag."""
    return " ".join(tag.replace("_", " ").split()).casefold()


def strip_weight(part: str) -> str:
    """`(masterpiece:1.2)` -> `masterpiece`, `((best quality))` -> `best quality`; other text unchanged."""
    match = _WEIGHTED.match(part.strip())
    if match is None:
        return part
    return match.group("tag") if match.group("tag") is not None else match.group("bare")
