r"""Caption files, the text files beside images that captioning and tagging tools read and write.

Standard library only: import-images reads them, evaluate --save-txt writes them, both with the
grammar below, so what one writes the other reads back as the same tags.

Reading (parse_caption): a caption whose text holds a comma is split at commas and line breaks; one
without a comma but with several non-empty lines holds one tag a line; otherwise whitespace separates
the tags. A backslash before one of  \ , ( ) [ ] { }  makes that character part of the tag (`\,` is a
comma inside a tag, `\(` a bracket that is not a prompt weight); any other backslash is itself. Each
entry then loses its prompt weight (`(masterpiece:1.2)` -> masterpiece), its escapes, its case and its
inner whitespace (spaces become underscores); repeats are dropped, the first order kept.

Writing (format_caption, append_caption): tags joined by ", ", with what reading would change escaped:
commas, a leading bracket, a backslash before an escapable character or at the end. A caption of a
single tag that holds a space ends with a comma (`white background,`), so that it is read in the comma
form and stays one tag.
"""

from __future__ import annotations

import re
from pathlib import Path

from deepdanbooru.errors import UserError, file_field

DEFAULT_EXTENSION = ".txt"
# Emoticon tags such as ^_^ or o_o keep their underscores (the convention of captioning tools).
_SHORTEST_SPACED = 4
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


ESCAPABLE = frozenset("\\,()[]{}")
BRACKETS = "([{"
# The characters str.splitlines() breaks lines at: a tag never holds one.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _pieces(text: str, at) -> list[str]:
    """`text` cut where at(char) is true, escape pairs kept whole (and as written)."""
    entries, current, index = [], [], 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text) and text[index + 1] in ESCAPABLE:
            current.append(text[index:index + 2])
            index += 2
            continue
        if at(char):
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    entries.append("".join(current))
    return entries


def _split(text: str, at) -> list[str]:
    """The entries of `text` cut where at(char) is true, stripped, the empty ones left out."""
    return [entry.strip() for entry in _pieces(text, at) if entry.strip()]


def split_caption(text: str) -> tuple[list[str], bool]:
    """(the entries of a caption as written, whether it lists one tag a line); see the module's grammar."""
    if len(_pieces(text, lambda char: char == ",")) > 1:
        return _split(text, lambda char: char == "," or char in LINE_BREAKS), False
    lines = _split(text, LINE_BREAKS.__contains__)
    if len(lines) > 1:
        return lines, True
    return _split(text, str.isspace), False


def _unescape(entry: str) -> str:
    return re.sub(r"\\([\\,()\[\]{}])", r"\1", entry)


def read_tag(entry: str) -> str:
    r"""One entry of a caption as written -> its tag: `(Saber \(Fate\):1.1)` -> `saber_(fate)`."""
    return "_".join(_unescape(strip_weight(entry.strip())).lower().split())


def parse_caption(text: str) -> list[str]:
    """The tags of a caption file's text, in order, each once."""
    return list(dict.fromkeys(tag for tag in map(read_tag, split_caption(text)[0]) if tag))


def write_tag(tag: str, remove_underscore: bool = False) -> str:
    """A tag as a caption entry that read_tag reads back as the same tag.

    remove_underscore writes `long hair` for long_hair, except for tags shorter than 4 characters (the
    emoticons ^_^ and o_o) and where reading would not give the underscores back (`a__b`, `_a`).
    """
    tag = tag.strip()
    if any(char in LINE_BREAKS for char in tag):
        raise CaptionError(f"tag {tag!r} holds a line break, which a caption file cannot hold")
    spaced = tag.replace("_", " ")
    if remove_underscore and len(tag) >= _SHORTEST_SPACED and "_".join(spaced.split()) == "_".join(tag.split()):
        tag = spaced
    out = []
    for index, char in enumerate(tag):
        following = tag[index + 1:index + 2]
        if char == "," or (index == 0 and char in BRACKETS) or (char == "\\" and following in {*ESCAPABLE, ""}):
            out.append("\\")
        out.append(char)
    return "".join(out)


def _keeps(entry: str) -> bool:
    """Whether an entry as written stays one entry, the same, between commas."""
    return _split(f"{entry},x", lambda char: char == ",") == [entry, "x"]


def _join(entries: list[str], lines: bool = False) -> str:
    if lines:
        return "\n".join(entries)
    if len(entries) == 1 and any(char.isspace() for char in entries[0]):
        return entries[0] + ","
    return ", ".join(entries)


def format_caption(tags, remove_underscore: bool = False) -> str:
    """The text of a caption file holding `tags` ('tag1, tag2'); reading it gives the tags, each once."""
    return append_caption("", tags, remove_underscore)


def append_caption(existing: str, tags, remove_underscore: bool = False) -> str:
    """`existing` with the tags it does not hold yet (in any spelling) added; unchanged when it holds them all.

    The caption is read with the grammar above and rewritten in its comma form (one tag a line when it
    listed one a line), its own entries kept as written where they read back the same between commas,
    so reading the result gives the existing tags and then the new ones.
    """
    entries, lines = split_caption(existing)
    held = {read_tag(entry) for entry in entries}
    additions = []
    for tag in tags:
        entry = write_tag(tag, remove_underscore)
        key = read_tag(entry)
        if key and key not in held:
            held.add(key)
            additions.append(entry)
    if not additions:
        return existing
    kept = [entry if _keeps(entry) else write_tag(read_tag(entry)) for entry in entries]
    body = existing.rstrip()
    return _join(kept + additions, lines) + existing[len(body):]


def tag_key(tag: str) -> str:
    """What two spellings of one tag share: 'Long_Hair' and 'long hair' are the same tag."""
    return " ".join(tag.replace("_", " ").split()).casefold()


def strip_weight(part: str) -> str:
    """`(masterpiece:1.2)` -> `masterpiece`, `((best quality))` -> `best quality`; other text unchanged."""
    match = _WEIGHTED.match(part.strip())
    if match is None:
        return part
    return match.group("tag") if match.group("tag") is not None else match.group("bare")
