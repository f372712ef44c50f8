"""Caption files: reading them, spelling tags in them, appending to them (no TensorFlow)."""

import random

import pytest

from deepdanbooru.captions import (CaptionError, append_caption, caption_extension, caption_separator, format_caption,
                                   parse_caption, read_caption, strip_weight, tag_key, write_tag)
from deepdanbooru.inference.caption_files import CaptionOptions, caption_text, existing_captions


def test_prompt_weights_are_stripped_and_escaped_brackets_kept():
    assert strip_weight("(masterpiece:1.2)") == "masterpiece"
    assert strip_weight("((best quality))") == "best quality"
    assert strip_weight("[lowres:0.8]") == "lowres"
    assert strip_weight(r"(saber \(fate\):1.1)") == r"saber \(fate\)"
    for unchanged in ("saber_(fate)", "(o)_(o)", ":d", r"\(9\)", "ratio:16"):
        assert strip_weight(unchanged) == unchanged


def test_tag_key_and_extension():
    assert tag_key("Long_Hair") == tag_key(" long  hair ") == "long hair"
    assert caption_extension("caption") == caption_extension(".caption") == ".caption"
    for bad in ("", ".", "a/b", "*.txt", ".tar."):
        with pytest.raises(CaptionError, match="is not a file-name extension"):
            caption_extension(bad)


def test_caption_text_appends_only_what_is_new_in_the_file_s_own_layout():
    assert caption_text(["long_hair", "^_^"], remove_underscore=True) == "long hair, ^_^"
    assert caption_text(["red", "long_hair"], "Long hair, my cat\n") == "Long hair, my cat, red\n"
    assert caption_text(["red"], "my cat,") == "my cat, red"
    assert caption_text(["red", "blue"], "long hair\nmy cat\n") == "long hair\nmy cat\nred\nblue\n"
    assert caption_text(["red"], "red") == "red"
    assert caption_text(["red"], "  \n") == "red  \n"


def test_existing_captions_are_refused_read_or_replaced(tmp_path):
    images = [tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png"]
    (tmp_path / "a.txt").write_text("mine")
    (tmp_path / "b.txt").write_text("also mine")
    with pytest.raises(CaptionError, match=r"a.txt: already exists \(and 1 other\); --overwrite"):
        existing_captions(images, CaptionOptions())
    assert existing_captions(images, CaptionOptions(overwrite=True)) == {}
    assert existing_captions(images, CaptionOptions(append=True)) == {tmp_path / "a.txt": "mine",
                                                                     tmp_path / "b.txt": "also mine"}
    (tmp_path / "b.txt").write_bytes(b"\xff\xfeo\x00k\x00")
    with pytest.raises(CaptionError, match=r"b.txt: is not UTF-8 text \(byte 0xff at offset 0\)"):
        read_caption(tmp_path / "b.txt")
    with pytest.raises(CaptionError, match="--overwrite and --append: give one"):
        CaptionOptions(overwrite=True, append=True).check(save_txt=True)
    with pytest.raises(CaptionError, match="--overwrite, --caption-extension: only used with --save-txt"):
        CaptionOptions(overwrite=True, extension=".caption").check(save_txt=False)


# --- one grammar for writing and reading ---

TRICKY = ["long_hair", "1girl", "white background", "^_^", "o_o", ">_<", "(o)_(o)", "saber_(fate)", "(9)", "(:",
          ":)", "[lowres:0.8]", "(masterpiece:1.2)", "((best quality))", "{x}", "\\m/", "a\\", "\\(", "\\\\",
          "x\\,y", "a,b", ",", ", ,", "rating:general", ":d", "a__b", "_a", "b_", "____", "星空", "Ünïcödé", "ß",
          "café au lait", "a\u3000b", "\xa0", " ", "_", "Long_Hair", "LONG HAIR", "évery_tag_(série)"]
PIECES = ["a", "b", "hair", "_", " ", "  ", "(", ")", "[", "]", "{", "}", "\\", ",", ":", "1.2", "星", "É", "\u3000",
          "^", "'", "\""]
SEPARATORS = [", ", ",", " ,", "\n", "\r\n", " ", "\t", "\n\n", ",\n", "\u2028", "  "]


def read_back(tag):
    """The tag a caption gives back for `tag`: lower-cased, inner whitespace as underscores."""
    return "_".join(tag.lower().split())


def expected(tags):
    return list(dict.fromkeys(tag for tag in map(read_back, tags) if tag))


def random_tag(rng):
    if rng.random() < 0.4:
        return rng.choice(TRICKY)
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 5)))


def random_caption(rng, separator=", "):
    """Text such as people and tools write: tags or fragments between any separators (often `separator`)."""
    parts = [rng.choice([random_tag(rng), rng.choice(TRICKY).replace(" ", "_")]) for _ in range(rng.randint(0, 5))]
    text = ""
    for part in parts:
        text += part + (separator if rng.random() < 0.5 else rng.choice(SEPARATORS))
    return text if rng.random() < 0.5 else text.rstrip()


# The default (3000 draws), then separators of other tools and ones that clash with the grammar: whitespace
# alone (tags then hold no space), line breaks (one tag a line), characters of tags (`:`, `-`), several
# characters (`||`), an escapable comma inside the mark (`|,`), a bracket (`(`, which prompt weights use).
OTHER_SEPARATORS = [",", " ", "  ", "\t", "|", " | ", "||", "|,", ";", ":", "-", "(", "\n", "\r\n", ",\n", "、 "]
RUNS = [(", ", 3000)] + [(separator, 300) for separator in OTHER_SEPARATORS]


@pytest.mark.parametrize("separator,draws", RUNS)
def test_what_is_written_reads_back_as_the_same_tags(separator, draws):
    rng = random.Random(20240607)
    for _ in range(draws):
        tags = [random_tag(rng) for _ in range(rng.randint(0, 6))]
        remove_underscore = rng.random() < 0.5
        text = format_caption(tags, remove_underscore, separator)
        assert parse_caption(text, separator) == expected(tags), (tags, remove_underscore, text)
        for tag in tags:  # one tag alone, the caption most likely to be misread
            alone = format_caption([tag], remove_underscore, separator)
            assert parse_caption(alone, separator) == expected([tag]), (tag, remove_underscore, alone)


@pytest.mark.parametrize("separator,draws", RUNS)
def test_appending_reads_back_as_the_caption_s_tags_then_the_new_ones(separator, draws):
    rng = random.Random(7)
    for _ in range(draws):
        existing = random_caption(rng, separator)
        tags = [random_tag(rng) for _ in range(rng.randint(0, 4))]
        remove_underscore = rng.random() < 0.5
        text = append_caption(existing, tags, remove_underscore, separator)
        held = parse_caption(existing, separator)
        assert parse_caption(text, separator) == list(dict.fromkeys(held + expected(tags))), (
            existing, tags, remove_underscore, text)
        if set(expected(tags)) <= set(held):
            assert text == existing


def test_the_cases_that_used_to_read_back_wrong():
    # A whitespace-separated caption is read, not glued to the first new tag.
    text = append_caption("1girl long_hair smile", ["white_background", "smile", "1girl"])
    assert text == "1girl, long_hair, smile, white_background"
    assert parse_caption(text) == ["1girl", "long_hair", "smile", "white_background"]
    assert append_caption("1girl long_hair smile\n", ["long hair"]) == "1girl long_hair smile\n"
    # One tag holding a space ends with a comma, so it stays one tag; without a space it stands alone.
    assert format_caption(["white_background"], remove_underscore=True) == "white background,"
    assert parse_caption("white background,") == ["white_background"]
    assert format_caption(["red"]) == "red" and format_caption([]) == ""
    # One tag a line stays one tag a line.
    assert append_caption("long hair\nmy cat\n", ["blue eyes"], True) == "long hair\nmy cat\nblue eyes\n"


def test_commas_brackets_and_backslashes_are_escaped_where_reading_would_change_them():
    assert write_tag("a,b") == "a\\,b" and parse_caption("a\\,b, c") == ["a,b", "c"]
    assert write_tag("(masterpiece:1.2)") == "\\(masterpiece:1.2)"  # not a prompt weight
    assert write_tag("saber_(fate)") == "saber_(fate)" and write_tag("\\m/") == "\\m/"
    assert write_tag("a\\") == "a\\\\" and parse_caption("a\\\\, b") == ["a\\", "b"]
    assert parse_caption("saber \\(fate\\), \\[x\\]") == ["saber_(fate)", "[x]"]
    # Underscores become spaces only where reading gives them back, and not in short emoticons.
    assert [write_tag(tag, True) for tag in ("long_hair", "^_^", "a__b", "_abc", "x_ y")] == [
        "long hair", "^_^", "a__b", "_abc", "x_ y"]
    with pytest.raises(CaptionError, match="holds a line break"):
        write_tag("a\nb")


def test_other_separators_are_written_and_read_as_kohya_s_tools_use_them():
    tags = ["long_hair", "a|b", "rating:general", "white_background"]
    assert format_caption(tags, True, " | ") == "long hair | a\\|b | rating:general | white background"
    assert format_caption(tags, True, " ") == "long_hair a|b rating:general white_background"
    assert format_caption(tags, True, "\n") == "long hair\na|b\nrating:general\nwhite background"
    assert format_caption(["white_background"], True, "|") == "white background|"
    # Reading looks for the separator without its surrounding spaces: ', ' and ',' read alike.
    assert parse_caption("1girl,long hair , smile", ", ") == parse_caption("1girl,long hair , smile", ",") == [
        "1girl", "long_hair", "smile"]
    assert parse_caption("a, b|c d", "|") == ["a,_b", "c_d"] and parse_caption("a, b|c d") == ["a", "b|c_d"]
    assert parse_caption("long hair\tsmile\n1girl", "\t") == ["long", "hair", "smile", "1girl"]
    assert parse_caption("long hair", "\n") == ["long_hair"] and parse_caption("long hair") == ["long", "hair"]
    # A caption without the mark falls back as the default grammar does: one tag a line, then whitespace.
    assert parse_caption("long hair\nsmile", "|") == ["long_hair", "smile"]
    assert append_caption("1girl solo", ["long hair"], True, " | ") == "1girl | solo | long hair"


@pytest.mark.parametrize("separator,reason", [
    ("", "is empty"), ("\\", "holds a backslash"), (" \\| ", "holds a backslash"), ("| |", "holds whitespace"),
    (",\n,", "holds whitespace"), (" and ", "holds letters, digits or underscores"), ("_", "holds letters")])
def test_separators_reading_could_not_find_again_are_refused(separator, reason):
    assert caption_separator(", ") == ", " and caption_separator("\n") == "\n"
    with pytest.raises(CaptionError, match=f"^--caption-separator: .* {reason}"):
        caption_separator(separator)
    with pytest.raises(CaptionError, match="--caption-separator"):
        format_caption(["a"], separator=separator)
