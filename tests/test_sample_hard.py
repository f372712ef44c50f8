"""make-sample-dataset --preset hard: determinism, vocabulary, tag statistics, pixels."""

import json
import sqlite3
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.errors import DatasetError
from deepdanbooru.project.tags import load_tags
from deepdanbooru.sample import hard
from deepdanbooru.sample.generator import generate_sample_dataset


def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def tag_strings(database):
    connection = sqlite3.connect(database)
    try:
        return [row[0].split() for row in connection.execute("SELECT tag_string FROM posts ORDER BY id")]
    finally:
        connection.close()


def test_equal_arguments_give_byte_identical_files_and_the_recipe_names_the_preset(tmp_path):
    generate_sample_dataset(tmp_path / "a", count=10, size=32, seed=5, preset="hard")
    generate_sample_dataset(tmp_path / "b", count=10, size=32, seed=5, preset="hard")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    recipe = json.loads((tmp_path / "a" / "sample.json").read_text())
    assert recipe["preset"] == "hard" and recipe["preset_version"] == hard_version()
    assert load_tags(tmp_path / "a" / "tags.txt") == list(hard.TAGS)
    basic = generate_sample_dataset(tmp_path / "c", count=10, size=32, seed=5)[0]
    assert "preset" not in json.loads((tmp_path / "c" / "sample.json").read_text())
    assert tag_strings(basic) != tag_strings(tmp_path / "a" / "dataset.sqlite")


def hard_version():
    from deepdanbooru.sample.generator import PRESETS

    return PRESETS["hard"][1]


def test_unknown_preset_is_refused(tmp_path):
    with pytest.raises(DatasetError, match="preset 'harder' is not one of basic, hard"):
        generate_sample_dataset(tmp_path / "x", count=2, size=16, preset="harder")
    assert not (tmp_path / "x").exists()


def test_cli_preset_and_rerun_keeps_the_dataset(tmp_path):
    target = tmp_path / "data"
    args = ["make-sample-dataset", str(target), "--preset", "hard", "--count", "5", "--size", "32"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    assert f"Wrote 5 posts with {len(hard.TAGS)} tags" in first.output
    stamp = (target / "dataset.sqlite").stat().st_mtime_ns
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "nothing to do" in again.output
    assert (target / "dataset.sqlite").stat().st_mtime_ns == stamp
    # the same options but the basic preset are a different dataset
    other = CliRunner().invoke(main, args[:2] + args[4:])
    assert other.exit_code == 2 and "already exists; use --overwrite" in other.output


def test_vocabulary_is_large_and_tags_are_consistent_with_each_other(tmp_path):
    assert len(hard.TAGS) >= 150 and len(set(hard.TAGS)) == len(hard.TAGS)
    database, _ = generate_sample_dataset(tmp_path, count=40, size=32, preset="hard")
    textures = {f"{t}_background" for t in hard.TEXTURES}
    backgrounds = {f"{c}_background" for c in hard.BACKGROUND_COLOURS}
    for words in tag_strings(database):
        assert words == sorted(words, key=hard.TAGS.index)
        present = set(words)
        assert len(present & textures) == 1 and len(present & backgrounds) == 1
        (count_tag,) = present & set(hard.COUNT_TAGS)
        count = hard.COUNT_TAGS.index(count_tag) + 1
        shapes, colours = present & set(hard.SHAPES), present & set(hard.COLOURS)
        pairs = {(c, s) for c in hard.COLOURS for s in hard.SHAPES if f"{c}_{s}" in present}
        assert {s for _, s in pairs} == shapes and {c for c, _ in pairs} == colours
        assert 1 <= len(pairs) <= count
        assert ("multicolored" in present) == (len(colours) > 1)
        assert ("same_shape" in present) == (count > 1 and len(shapes) == 1)
        for shape in hard.SHAPES:
            if f"large_{shape}" in present:
                assert shape in present and "large_object" in present
            if f"multiple_{hard._plural(shape)}" in present:
                assert shape in present and count >= 2
        sizes = present & {f"{s}_object" for s in hard.SIZES}
        assert 1 <= len(sizes) <= count
        assert len(present & {"overlapping", "nested", "in_a_row"}) <= 1
        if "nested" in present:
            assert {"large_object", "small_object"} <= present and count >= 2
        if "in_a_row" in present:
            assert count >= 3


def test_frequencies_are_long_tailed_and_every_group_occurs():
    # Tags do not depend on the stored size; draw small pictures without encoding them.
    seen = Counter()
    pictures = 400
    for index in range(pictures):
        _, tags = hard.draw_picture(np.random.default_rng([0, index]), 16)
        seen.update(tags)
    share = {tag: seen[tag] / pictures for tag in hard.TAGS}
    assert max(share.values()) > 0.5
    rare = [tag for tag, value in share.items() if value < 0.01]
    assert len(rare) >= 40, len(rare)
    assert all(share[tag] > 0 for tag in (*hard.COUNT_TAGS, *hard.RELATIONS, *hard.IMAGE_TAGS, *hard.SHAPES,
                                          *hard.COLOURS))
    # The Zipf order holds for the shapes' own tags.
    assert share["circle"] > share["square"] > share["triangle"] > share["ellipse"]
    assert 0.1 < share["overlapping"] < 0.3 and 0.05 < share["nested"] < 0.2


def test_plain_backgrounds_show_their_colour_at_the_corner(tmp_path):
    database, _ = generate_sample_dataset(tmp_path, count=60, size=32, image_format="png", preset="hard")
    connection = sqlite3.connect(database)
    rows = connection.execute("SELECT md5, tag_string FROM posts").fetchall()
    connection.close()
    checked = 0
    for md5, tag_string in rows:
        words = set(tag_string.split())
        if "plain_background" not in words or "heavy_noise" in words:
            continue
        (name,) = [c for c in hard.BACKGROUND_COLOURS if f"{c}_background" in words]
        with Image.open(tmp_path / "images" / md5[:2] / f"{md5}.png") as image:
            corner = np.asarray(image.convert("RGB"), dtype=np.float64)[:4, :4].reshape(-1, 3).mean(axis=0)
        assert np.abs(corner - hard.BACKGROUND_COLOURS[name]).max() <= 16, (tag_string, corner)
        checked += 1
    assert checked >= 3
