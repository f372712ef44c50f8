r"""Caption files, the text files beside images that captioning and tagging tools read and write.

Standard library only: import-images reads them, evaluate --save-txt writes them, both with the
grammar below, so what one writes the other reads back as the same tags.

The separator (--caption-separator; ", " by default, as kohya's tagger writes) is the string between
tags. Reading looks for its mark, the separator without its surrounding whitespace (", " and "," both
have the mark ","); a separator of whitespace alone has none: it means one tag a line when it holds a
line break, and whitespace between tags otherwise.

Reading (parse_caption): with a mark, a caption whose text holds the mark is split at it and at line
breaks; one without it but with several non-empty lines holds one tag a line; otherwise whitespace
separates the tags. A backslash before one of  \ , ( ) [ ] { }  or a character of the mark makes that
character part of the tag (`\,` is a comma inside a tag, `\(` a bracket that is not a prompt weight);
any other backslash is itself. Each entry then loses its prompt weight (`(masterpiece:1.2)` ->
masterpiece), its escapes, its case and its inner whitespace (spaces become underscores); repeats are
dropped, the first order kept.

Writing (format_caption, append_caption): tags joined by the separator, with what reading would change
escaped: the mark's characters, a leading bracket, a backslash before an escapable character or at the
end. A caption of a single tag that holds a space ends with the mark (`white background,`), so that it
is read in the separated form and stays one tag. Between whitespace separators a tag is written with
underscores for its spaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
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
DEFAULT_SEPARATOR = ", "


def caption_separator(text: str, option: str = "--caption-separator") -> str:
    """The separator as given, or one line naming `option` when reading could not find it again."""
    mark = text.strip()
    reason = None
    if not text:
        reason = "is empty; give the string between tags, such as ', '"
    elif "\\" in text:
        reason = "holds a backslash, which starts an escape in captions"
    elif any(char.isspace() for char in mark):
        reason = "holds whitespace between other characters (around them it may: ' | ')"
    elif any(char.isalnum() or char == "_" for char in mark):
        reason = "holds letters, digits or underscores, which tags are made of"
    if reason:
        raise CaptionError(f"{option}: {text!r} {reason}")
    return text


@dataclass(frozen=True)
class _Grammar:
    """How captions with one separator are cut into entries and what their escapes are."""

    separator: str
    mark: str  # "" for a separator of whitespace alone
    lines: bool  # whitespace with a line break: one tag a line
    escapable: frozenset

    def at_mark(self, text: str, index: int) -> int:
        """The length of the mark when `text` has it at `index`, else 0."""
        return len(self.mark) if self.mark and text.startswith(self.mark, index) else 0

    def cut(self, text: str, index: int) -> int:
        """How many characters of `text` from `index` are a separator (0: none)."""
        if self.mark:
            return self.at_mark(text, index) or _line_break(text, index)
        return _line_break(text, index) if self.lines else _space(text, index)


@lru_cache(maxsize=16)
def _grammar(separator: str) -> _Grammar:
    caption_separator(separator)
    mark = separator.strip()
    return _Grammar(separator, mark, not mark and any(char in LINE_BREAKS for char in separator),
                    ESCAPABLE | frozenset(mark))


def _pieces(text: str, at, escapable=ESCAPABLE) -> list[str]:
    """`text` cut where at(text, index) gives a separator's length, escape pairs kept whole (and as written)."""
    entries, current, index = [], [], 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text) and text[index + 1] in escapable:
            current.append(text[index:index + 2])
            index += 2
            continue
        length = at(text, index)
        if length:
            entries.append("".join(current))
            current = []
            index += length
        else:
            current.append(char)
            index += 1
    entries.append("".join(current))
    return entries


def _split(text: str, at, escapable=ESCAPABLE) -> list[str]:
    """The entries of `text` cut where `at` finds a separator, stripped, the empty ones left out."""
    return [entry.strip() for entry in _pieces(text, at, escapable) if entry.strip()]


def _line_break(text: str, index: int) -> int:
    return int(text[index] in LINE_BREAKS)


def _space(text: str, index: int) -> int:
    return int(text[index].isspace())


def split_caption(text: str, separator: str = DEFAULT_SEPARATOR) -> tuple[list[str], bool]:
    """(the entries of a caption as written, whether it lists one tag a line); see the module's grammar."""
    grammar = _grammar(separator)
    if not grammar.mark or len(_pieces(text, grammar.at_mark, grammar.escapable)) > 1:
        return _split(text, grammar.cut, grammar.escapable), False
    lines = _split(text, _line_break, grammar.escapable)
    if len(lines) > 1:
        return lines, True
    return _split(text, _space, grammar.escapable), False


def _unescape(entry: str, escapable=ESCAPABLE) -> str:
    out, index = [], 0
    while index < len(entry):
        escaped = entry[index] == "\\" and entry[index + 1:index + 2] in escapable
        out.append(entry[index + escaped])
        index += 1 + escaped
    return "".join(out)


def read_tag(entry: str, separator: str = DEFAULT_SEPARATOR) -> str:
    r"""One entry of a caption as written -> its tag: `(Saber \(Fate\):1.1)` -> `saber_(fate)`."""
    escapable = _grammar(separator).escapable
    return "_".join(_unescape(strip_weight(entry.strip()), escapable).lower().split())


def parse_caption(text: str, separator: str = DEFAULT_SEPARATOR) -> list[str]:
    """The tags of a caption file's text, in order, each once."""
    return list(dict.fromkeys(tag for tag in (read_tag(entry, separator)
                                              for entry in split_caption(text, separator)[0]) if tag))


def write_tag(tag: str, remove_underscore: bool = False, separator: str = DEFAULT_SEPARATOR) -> str:
    """A tag as a caption entry that read_tag reads back as the same tag.

    remove_underscore writes `long hair` for long_hair, except for tags shorter than 4 characters (the
    emoticons ^_^ and o_o), where reading would not give the underscores back (`a__b`, `_a`) and between
    separators of whitespace alone that are not line breaks (there a tag's spaces become underscores).
    """
    grammar = _grammar(separator)
    tag = tag.strip()
    if any(char in LINE_BREAKS for char in tag):
        raise CaptionError(f"tag {tag!r} holds a line break, which a caption file cannot hold")
    if not grammar.mark and not grammar.lines:
        tag = "_".join(tag.split())
    spaced = tag.replace("_", " ")
    if (remove_underscore and (grammar.mark or grammar.lines) and len(tag) >= _SHORTEST_SPACED
            and "_".join(spaced.split()) == "_".join(tag.split())):
        tag = spaced
    out = []
    for index, char in enumerate(tag):
        following = tag[index + 1:index + 2]
        if (char in grammar.mark or (index == 0 and char in BRACKETS)
                or (char == "\\" and (following in grammar.escapable or not following))):
            out.append("\\")
        out.append(char)
    return "".join(out)


def _keeps(entry: str, grammar: _Grammar) -> bool:
    """Whether an entry as written stays one entry, the same, between separators."""
    return _split(f"{entry}{grammar.separator}x", grammar.cut, grammar.escapable) == [entry, "x"]


def _join(entries: list[str], grammar: _Grammar, lines: bool = False) -> str:
    if lines:
        return "\n".join(entries)
    if grammar.mark and len(entries) == 1 and any(char.isspace() for char in entries[0]):
        return entries[0] + grammar.mark
    return grammar.separator.join(entries)


def format_caption(tags, remove_underscore: bool = False, separator: str = DEFAULT_SEPARATOR) -> str:
    """The text of a caption file holding `tags` ('tag1, tag2'); reading it gives the tags, each once."""
    return append_caption("", tags, remove_underscore, separator)


def append_caption(existing: str, tags, remove_underscore: bool = False, separator: str = DEFAULT_SEPARATOR) -> str:
    """`existing` with the tags it does not hold yet (in any spelling) added; unchanged when it holds them all.

    The caption is read with the grammar above and rewritten with the separator (one tag a line when it
    listed one a line), its own entries kept as written where they read back the same between
    separators, so reading the result gives the existing tags and then the new ones.
    """
    grammar = _grammar(separator)
    entries, lines = split_caption(existing, separator)
    held = {read_tag(entry, separator) for entry in entries}
    additions = []
    for tag in tags:
        entry = write_tag(tag, remove_underscore, separator)
        key = read_tag(entry, separator)
        if key and key not in held:
            held.add(key)
            additions.append(entry)
    if not additions:
        return existing
    kept = [entry if _keeps(entry, grammar) else write_tag(read_tag(entry, separator), separator=separator)
            for entry in entries]
    body = existing.rstrip()
    return _join(kept + additions, grammar, lines) + existing[len(body):]


def multi_word_spelling(entries) -> tuple[int, int]:
    """(entries writing words apart with spaces, entries joining them with underscores) among caption entries as
    written: how a caption, or a folder of them, spells its multi-word tags. Emoticons such as ^_^ are no words."""
    spaced = joined = 0
    for entry in entries:
        entry = entry.strip()
        spaced += " " in entry
        joined += "_" in entry and " " not in entry and len(entry) >= _SHORTEST_SPACED
    return spaced, joined


def tag_key(tag: str) -> str:
    """What two spellings of one tag share: 'Long_Hair' and 'long hair' are the same tag."""
    return " ".join(tag.replace("_", " ").split()).casefold()


def strip_weight(part: str) -> str:
    """`(masterpiece:1.2)` -> `masterpiece`, `((best quality))` -> `best quality`; other text unchanged."""
    match = _WEIGHTED.match(part.strip())
    if match is None:
        return part
    return match.group("tag") if match.group("tag") is not None else match.group("bare")
