import pytest

from deepdanbooru.errors import TagsError
from deepdanbooru.project.tags import load_tags, parse_tags, tags_hash


def test_strip_and_skip_blank_lines():
    assert parse_tags("  1girl \n\n\tsmile\n   \nlong_hair\n", "tags.txt") == ["1girl", "smile", "long_hair"]


def test_duplicate_names_both_lines(tmp_path):
    path = tmp_path / "tags.txt"
    path.write_text("a\nb\n\na \n")
    with pytest.raises(TagsError) as caught:
        load_tags(path)
    assert str(caught.value) == f"{path}: line 4: duplicate tag 'a' (first on line 1); two outputs would alias"


def test_empty_is_an_error(tmp_path):
    path = tmp_path / "tags.txt"
    path.write_text("\n  \n")
    with pytest.raises(TagsError, match="tags.txt: holds no tags"):
        load_tags(path)


def test_missing_file(tmp_path):
    with pytest.raises(TagsError, match="tags.txt: not found"):
        load_tags(tmp_path / "tags.txt")
    (tmp_path / "tags.txt").mkdir()
    with pytest.raises(TagsError, match="tags.txt: is a folder, not a file"):
        load_tags(tmp_path / "tags.txt")


def test_inner_whitespace_rejected():
    with pytest.raises(TagsError, match="line 2: tag 'long hair' contains whitespace"):
        parse_tags("a\nlong hair\n", "tags.txt")


def test_not_utf8(tmp_path):
    path = tmp_path / "tags.txt"
    path.write_bytes(b"\xff\xfe\x00a")
    with pytest.raises(TagsError, match="cannot be read"):
        load_tags(path)


def test_hash_depends_on_order_not_blank_lines():
    assert tags_hash(parse_tags("a\nb\n", "t")) == tags_hash(parse_tags("a\n\n b\n", "t"))
    assert tags_hash(["a", "b"]) != tags_hash(["b", "a"])
