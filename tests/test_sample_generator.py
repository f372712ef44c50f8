from pathlib import Path
import hashlib
import sqlite3

import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.dataset.records import load_records
from deepdanbooru.errors import DatasetError
from deepdanbooru.project.tags import load_tags
from deepdanbooru.sample.generator import BACKGROUNDS, TAGS, generate_sample_dataset


def rows(database):
    connection = sqlite3.connect(database)
    try:
        return connection.execute(
            "SELECT id, md5, file_ext, tag_string, tag_count_general, rating, score, is_deleted FROM posts ORDER BY id"
        ).fetchall()
    finally:
        connection.close()


def tree(directory):
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_equal_arguments_give_byte_identical_files(tmp_path):
    generate_sample_dataset(tmp_path / "a", count=12, size=32, seed=3)
    generate_sample_dataset(tmp_path / "b", count=12, size=32, seed=3)
    first, second = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert first.keys() == second.keys()
    assert first == second
    generate_sample_dataset(tmp_path / "c", count=12, size=32, seed=4)
    assert rows(tmp_path / "c" / "dataset.sqlite") != rows(tmp_path / "a" / "dataset.sqlite")


def test_smaller_dataset_is_a_prefix_of_a_larger_one(tmp_path):
    small, _ = generate_sample_dataset(tmp_path / "small", count=5, size=32)
    large, _ = generate_sample_dataset(tmp_path / "large", count=9, size=32)
    assert rows(large)[:5] == rows(small)


def test_layout_md5_and_columns(sample_dataset):
    database, tags = sample_dataset
    assert database.name == "dataset.sqlite"
    table = rows(database)
    assert [r[0] for r in table] == list(range(1, 25))
    for row_id, md5, ext, tag_string, tag_count, rating, score, deleted in table:
        path = database.parent / "images" / md5[:2] / f"{md5}.{ext}"
        data = path.read_bytes()
        assert hashlib.md5(data).hexdigest() == md5
        assert ext == "jpg"
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.size == (32, 32) and image.mode == "RGB"
        words = tag_string.split()
        assert tag_count == len(words) >= 5
        assert set(words) <= set(tags)
        assert rating in ("g", "s", "q", "e") and 0 <= score < 100 and deleted in (0, 1)
    files = list((database.parent / "images").rglob("*.jpg"))
    assert len(files) == len(table)


def test_tags_txt_lists_every_tag_used_in_order(sample_dataset):
    database, tags = sample_dataset
    assert load_tags(database.parent / "tags.txt") == tags == list(TAGS)
    assert 10 <= len(tags) <= 20
    used = {word for row in rows(database) for word in row[3].split()}
    assert used <= set(tags)
    # tag_string keeps tags.txt order, so two generators never disagree on a string
    for row in rows(database):
        words = row[3].split()
        assert words == sorted(words, key=tags.index)


def test_every_picture_has_one_background_shape_count_and_size(tmp_path):
    database, _ = generate_sample_dataset(tmp_path, count=40, size=32, image_format="png")
    groups = [
        list(BACKGROUNDS),
        ["circle", "square", "triangle", "star"],
        ["one_shape", "two_shapes", "three_shapes"],
        ["large", "small"],
    ]
    seen = set()
    for _, md5, ext, tag_string, *_ in rows(database):
        words = set(tag_string.split())
        for group in groups:
            assert len(words & set(group)) == 1, (tag_string, group)
        colours = words & {"red", "green", "blue", "yellow"}
        assert 1 <= len(colours) <= 3
        assert ("multicolored" in words) == (len(colours) > 1)
        seen |= words
        # Shapes stay inside the safe disc, so the corner shows the background colour.
        background = BACKGROUNDS[next(iter(words & set(BACKGROUNDS)))]
        with Image.open(tmp_path / "images" / md5[:2] / f"{md5}.{ext}") as image:
            corner = image.convert("RGB").getpixel((0, 0))
        assert max(abs(a - b) for a, b in zip(corner, background)) <= 10, (tag_string, corner)
    assert seen == set(TAGS)


@pytest.mark.parametrize("image_format, pillow_name", [
    ("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP"), ("gif", "GIF"), ("bmp", "BMP"),
])
def test_each_image_format(tmp_path, image_format, pillow_name):
    database, _ = generate_sample_dataset(tmp_path, count=3, size=24, image_format=image_format)
    for _, md5, ext, *_ in rows(database):
        assert ext == image_format
        path = tmp_path / "images" / md5[:2] / f"{md5}.{ext}"
        assert hashlib.md5(path.read_bytes()).hexdigest() == md5
        with Image.open(path) as image:
            assert image.format == pillow_name and image.size == (24, 24)
    records = load_records(database, minimum_tag_count=1, extensions=(image_format,))
    assert len(records) == 3


def test_records_loader_reads_the_generated_database(sample_dataset):
    database, _ = sample_dataset
    records = load_records(database, minimum_tag_count=1)
    assert list(records.ids) == list(range(1, 25))
    assert all(p.endswith(".jpg") for p in records.paths())
    assert len(load_records(database, minimum_tag_count=6)) == sum(1 for r in rows(database) if r[4] >= 6)


def test_refuses_to_overwrite_and_rejects_bad_arguments(tmp_path):
    database, _ = generate_sample_dataset(tmp_path, count=2, size=16)
    before = database.read_bytes()
    with pytest.raises(DatasetError, match="already exists; use --overwrite"):
        generate_sample_dataset(tmp_path, count=3, size=16)
    assert database.read_bytes() == before
    generate_sample_dataset(tmp_path, count=3, size=16, overwrite=True)
    assert len(rows(database)) == 3
    with pytest.raises(DatasetError, match="image format 'tiff'"):
        generate_sample_dataset(tmp_path / "x", image_format="tiff")
    with pytest.raises(DatasetError, match="count must be a positive integer"):
        generate_sample_dataset(tmp_path / "x", count=0)
    with pytest.raises(DatasetError, match="size must be an integer >= 16"):
        generate_sample_dataset(tmp_path / "x", size=8)
    assert not (tmp_path / "x").exists()


def test_cli_make_sample_dataset(tmp_path):
    target = tmp_path / "data"
    result = CliRunner().invoke(main, ["make-sample-dataset", str(target), "--count", "4", "--size", "16",
                                       "--seed", "2", "--format", "png"])
    assert result.exit_code == 0, result.output
    assert "Wrote 4 posts with 17 tags" in result.output
    table = rows(target / "dataset.sqlite")
    assert len(table) == 4 and {r[2] for r in table} == {"png"}
    again = CliRunner().invoke(main, ["make-sample-dataset", str(target)])
    assert again.exit_code == 2
    assert "already exists; use --overwrite" in again.output
    bad = CliRunner().invoke(main, ["make-sample-dataset", str(target), "--format", "tiff"])
    assert bad.exit_code == 2 and "tiff" in bad.output
    assert f"Use it in a project: set database_path to {(target / 'dataset.sqlite').resolve()}" in result.output


def test_the_sample_project_layout_is_not_told_to_set_its_own_keys(tmp_path):
    import shutil

    project = tmp_path / "sample-project"
    shutil.copytree(Path(__file__).resolve().parent.parent / "sample-project", project,
                    ignore=shutil.ignore_patterns("dataset", "checkpoints", "logs", "*.keras"))
    result = CliRunner().invoke(main, ["make-sample-dataset", str(project / "dataset"), "--count", "4", "--size", "16"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (f"{project / 'project.json'} already uses it; "
                                              f"next: deepdanbooru train-project {project}")
    assert "set database_path" not in result.output


def test_rerunning_the_command_with_the_same_options_keeps_the_dataset(tmp_path):
    from click.testing import CliRunner

    from deepdanbooru.cli import main

    target = tmp_path / "data"
    first = CliRunner().invoke(main, ["make-sample-dataset", str(target), "--count", "6", "--size", "16"])
    assert first.exit_code == 0, first.output
    stamp = (target / "dataset.sqlite").stat().st_mtime_ns
    again = CliRunner().invoke(main, ["make-sample-dataset", str(target), "--count", "6", "--size", "16"])
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output
    assert (target / "dataset.sqlite").stat().st_mtime_ns == stamp
    other = CliRunner().invoke(main, ["make-sample-dataset", str(target), "--count", "7", "--size", "16"])
    assert other.exit_code == 2
    assert "already exists; use --overwrite" in other.output
