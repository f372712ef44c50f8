"""categories.json (download-tags' file): one Danbooru category per tag of tags.txt."""

import json

import pytest

from deepdanbooru.errors import TagsError
from deepdanbooru.project.categories import category_indices, parse_categories, tag_categories


def test_starts_become_one_category_per_tag_and_rating_tags_are_ratings(tmp_path):
    tags = ["1girl", "smile", "hatsune_miku", "rating:general", "rating:explicit"]
    (tmp_path / "categories.json").write_text(json.dumps([
        {"name": "General", "start_index": 0}, {"name": "Character", "start_index": 2},
        {"name": "System", "start_index": 3}]))
    categories = tag_categories(tags, tmp_path)
    assert categories == [0, 0, 4, 9, 9]
    assert category_indices(categories) == {"general": [0, 1], "character": [2]}
    # Without the file: only the rating: prefix is known.
    assert tag_categories(tags, tmp_path / "missing") == [None, None, None, 9, 9]


@pytest.mark.parametrize("text, message", [
    ("{", "is not valid JSON"),
    ("[]", "must be a non-empty list"),
    ('[{"name": "Foo", "start_index": 0}]', "entry 1.name: unknown category 'Foo'"),
    ('[{"name": "General", "start_index": 9}]', "entry 1.start_index: must be an integer in [0, 3]"),
    ('[{"name": "General", "start_index": 1}]', "entry 1.start_index: must be 0"),
    ('[{"name": "General", "start_index": 0}, {"name": "Character", "start_index": 2}, '
     '{"name": "System", "start_index": 1}]', "entry 3.start_index: is below the previous entry's"),
])
def test_bad_files_name_the_entry(text, message):
    with pytest.raises(TagsError, match=message.replace("[", r"\[").replace("]", r"\]").replace("'", "'")):
        parse_categories(text, "categories.json", 3)
