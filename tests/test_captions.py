"""Caption files: reading them, spelling tags in them, appending to them (no TensorFlow)."""

import pytest

from deepdanbooru.captions import CaptionError, caption_extension, read_caption, strip_weight, tag_key
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
