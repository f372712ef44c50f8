import hashlib
import io
import json
import os
import sqlite3

import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.captions import parse_caption
from deepdanbooru.cli import main
from deepdanbooru.dataset.records import load_records
from deepdanbooru.project.tags import load_tags
from deepdanbooru.dataset import import_images as importer


def image_bytes(fmt, color=(200, 30, 30), size=(32, 24), mode="RGB"):
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format=fmt)
    return buffer.getvalue()


def put(folder, name, data, tags=None, sidecar=None):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if tags is not None:
        (sidecar and path.parent / sidecar or path.with_suffix(".txt")).write_text(tags, encoding="utf-8")
    return path


def read_posts(database):
    connection = sqlite3.connect(database)
    try:
        return connection.execute("SELECT id, md5, file_ext, tag_string, tag_count_general, rating, is_deleted "
                                  "FROM posts ORDER BY id").fetchall()
    finally:
        connection.close()


def invoke(*args):
    return CliRunner().invoke(main, ["import-images", *map(str, args)])


def test_parse_caption():
    assert parse_caption("1girl, Long Hair,  blue sky\n") == ["1girl", "long_hair", "blue_sky"]
    assert parse_caption("1girl long_hair  smile\n") == ["1girl", "long_hair", "smile"]
    assert parse_caption("a, b\nc d, a") == ["a", "b", "c_d"]
    assert parse_caption("saber \\(fate\\), rating:general") == ["saber_(fate)", "rating:general"]
    assert parse_caption(" \n , ,") == []


def test_one_tag_a_line_and_prompt_weights():
    assert parse_caption("long hair\nblue eyes\n\nsmile\n") == ["long_hair", "blue_eyes", "smile"]
    assert parse_caption("(masterpiece:1.2), ((best quality)), [lowres:0.8], (saber \\(fate\\):1.1), 1girl") == [
        "masterpiece", "best_quality", "lowres", "saber_(fate)", "1girl"]
    assert parse_caption("(masterpiece:1.2) 1girl") == ["masterpiece", "1girl"]


def test_caption_extension_and_a_caption_that_is_not_utf8(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "ignored, not a caption")
    (src / "a.caption").write_text("long hair\nblue eyes\n")
    result = invoke(src, dataset, "--caption-extension", "caption")
    assert result.exit_code == 0, result.output
    assert [post[3] for post in read_posts(dataset / "dataset.sqlite")] == ["long_hair blue_eyes"]

    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)))
    (src / "b.caption").write_bytes("café".encode("latin-1"))
    before = sorted(path.relative_to(dataset) for path in dataset.rglob("*"))
    result = invoke(src, dataset, "--caption-extension", ".caption")
    assert result.exit_code == 2
    assert result.stderr == f"error: {src / 'b.caption'}: is not UTF-8 text (byte 0xe9 at offset 3); save it as UTF-8\n"
    assert sorted(path.relative_to(dataset) for path in dataset.rglob("*")) == before
    assert len(read_posts(dataset / "dataset.sqlite")) == 1

    fresh = tmp_path / "fresh"
    result = invoke(src, fresh, "--caption-extension", ".caption")
    assert result.exit_code == 2
    assert not fresh.exists()


def test_caption_separator(tmp_path):
    """Captions with another separator (kohya's --caption_separator): '|' is read where the comma stands."""
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "long hair | a, b|saber \\(fate\\)\n")
    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)), "white background|")
    refused = invoke(src, dataset, "--caption-separator", "\\")
    assert refused.exit_code == 2 and not dataset.exists()
    assert refused.stderr == ("error: --caption-separator: '\\\\' holds a backslash, which starts an escape in "
                              "captions\n")
    result = invoke(src, dataset, "--caption-separator", " | ")
    assert result.exit_code == 0, result.output
    assert [post[3] for post in read_posts(dataset / "dataset.sqlite")] == ["long_hair a,_b saber_(fate)",
                                                                            "white_background"]


def test_a_caption_separator_no_caption_holds_is_named_with_the_captions_read_as_one_tag(tmp_path):
    """A separator the captions do not use reads each comma list as one tag (or splits it at spaces): refused."""
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "smile,cat\n")
    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)), "travel_&_places,sun")
    put(src, "c.png", image_bytes("PNG", color=(9, 90, 9)), "grinning face, face")
    refused = invoke(src, dataset, "--caption-separator", "|")
    assert refused.exit_code != 0 and not dataset.exists()
    assert refused.stderr == (
        f"error: {src}: --caption-separator '|': none of the 3 caption files read holds '|': 2 of them were each "
        "read as one tag (a.txt: 'smile,cat') and the others split at spaces or line breaks; give the separator your captions use "
        "(',' when the option is left out)\n")
    assert invoke(src, dataset).exit_code == 0  # the default: captions without a comma are plainly spaced tags
    assert [post[3] for post in read_posts(dataset / "dataset.sqlite")] == ["smile cat", "travel_&_places sun",
                                                                            "grinning_face face"]


def test_reimporting_an_edited_caption_updates_the_post(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "cat, rating:explicit")
    put(src, "b.png", image_bytes("PNG", color=(1, 1, 1)), "dog")
    assert invoke(src, dataset).exit_code == 0
    (src / "a.txt").write_text("cat, black cat, sitting")
    (src / "b.txt").write_text("Dog")
    result = invoke(src, dataset)
    assert result.exit_code == 0, result.output
    posts = read_posts(dataset / "dataset.sqlite")
    assert [(p[0], p[3], p[4], p[5]) for p in posts] == [(1, "cat black_cat sitting", 3, "e"), (2, "dog", 1, None)]
    assert f"note: {src / 'a.png'}: already in the dataset as post 1; its caption changed, the post's tags are " \
           "updated" in result.stderr
    assert "Updated the tags of 1 image already in the dataset (their captions changed)" in result.stdout
    assert f"note: {src / 'b.png'}: same bytes as the existing dataset, skipped" in result.stderr


def test_imports_layout_md5_formats_and_skips(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    jpeg = image_bytes("JPEG")
    png = image_bytes("PNG", color=(0, 0, 255))
    disguised = image_bytes("JPEG", color=(0, 255, 0))
    put(src, "a.jpg", jpeg, "cat, Black Cat")
    put(src, "sub/b.PNG", png, "dog fluffy_tail rating:general")
    put(src, "sub/deeper/c.png", disguised, "bird", sidecar="c.png.txt")  # JPEG bytes named .png
    put(src, "copy_of_a.jpeg", jpeg, "cat")  # same bytes as a.jpg
    put(src, "untagged.png", png + b"x")
    put(src, "empty.png", image_bytes("PNG", color=(1, 2, 3)), " , ")
    put(src, "broken.jpg", jpeg[: len(jpeg) // 2], "cat")
    put(src, "text.jpg", b"not an image at all", "cat")
    put(src, "notes.txt", b"ignored: not an image")

    result = invoke(src, dataset)
    assert result.exit_code == 0, result.output
    posts = read_posts(dataset / "dataset.sqlite")
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in
           (("a", jpeg), ("b", png), ("c", disguised))}
    assert posts == [
        (1, md5["a"], "jpg", "cat black_cat", 2, None, 0),
        (2, md5["b"], "png", "dog fluffy_tail rating:general", 2, "g", 0),
        (3, md5["c"], "jpg", "bird", 1, None, 0),
    ]
    for name, ext in (("a", "jpg"), ("b", "png"), ("c", "jpg")):
        stored = dataset / "images" / md5[name][:2] / f"{md5[name]}.{ext}"
        assert hashlib.md5(stored.read_bytes()).hexdigest() == md5[name]
        assert os.stat(stored).st_nlink == 1  # a copy, not a link
    assert "Imported 3 images" in result.output and "(ids 1-3)" in result.output
    assert "Skipped: 1 duplicate, 2 unreadable, 2 without tags" in result.output
    assert f"{src / 'broken.jpg'}: unreadable image skipped" in result.output
    assert f"{src / 'text.jpg'}: unreadable image skipped: not an image in a format Pillow knows" in result.output
    assert f"{src / 'untagged.png'}: skipped: no .txt sidecar" in result.output
    assert f"{src / 'empty.png'}: skipped: empty.txt holds no tags" in result.output
    assert f"{src / 'copy_of_a.jpeg'}: same bytes as a.jpg, skipped" in result.output
    assert "3 imported posts have fewer than 20 tags" in result.output
    # Nothing but the database and images/ is left in the dataset folder (no temporary files).
    assert sorted(os.listdir(dataset)) == ["dataset.sqlite", "images"]


def test_second_import_appends_after_max_id_and_skips_known(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "a")
    assert invoke(src, dataset).exit_code == 0
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    connection.execute("INSERT INTO posts (id, md5, file_ext, tag_string, tag_count_general) "
                       "VALUES (41, 'x', 'jpg', 'y', 1)")
    connection.commit()
    connection.close()
    put(src, "b.png", image_bytes("PNG", color=(9, 9, 9)), "b")
    result = invoke(src, dataset)
    assert result.exit_code == 0, result.output
    assert [(p[0], p[3]) for p in read_posts(dataset / "dataset.sqlite")] == [(1, "a"), (41, "y"), (42, "b")]
    assert "same bytes as the existing dataset" in result.output
    assert "Imported 1 image into" in result.output and "(ids 42-42)" in result.output


def test_append_to_deepdanbooru_database_without_optional_columns(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    dataset.mkdir()
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER)")
    connection.commit()
    connection.close()
    put(src, "a.gif", image_bytes("GIF"), "a b")
    result = invoke(src, dataset)
    assert result.exit_code == 0, result.output
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    assert connection.execute("SELECT id, file_ext, tag_string, tag_count_general FROM posts").fetchall() == [
        (1, "gif", "a b", 2)]
    connection.close()
    assert "1 imported image is gif, not png/jpg: add gif to image_extensions (create-project --database sets it)" \
        in result.output


def test_link_makes_hard_links(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    path = put(src, "a.webp", image_bytes("WEBP"), "a")
    result = invoke(src, dataset, "--link")
    assert result.exit_code == 0, result.output
    md5 = hashlib.md5(path.read_bytes()).hexdigest()
    stored = dataset / "images" / md5[:2] / f"{md5}.webp"
    assert os.path.samefile(stored, path)


def test_dataset_inside_src_is_not_scanned(tmp_path):
    src = tmp_path / "src"
    put(src, "a.png", image_bytes("PNG"), "a")
    assert invoke(src, src / "dataset").exit_code == 0
    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)), "b")
    result = invoke(src, src / "dataset")
    assert result.exit_code == 0, result.output
    assert "Skipped: 1 duplicate, 0 unreadable, 0 without tags" in result.output


def test_dataset_equal_to_src(tmp_path):
    src = tmp_path / "src"
    put(src, "a.png", image_bytes("PNG"), "a")
    assert invoke(src, src).exit_code == 0
    result = invoke(src, src)
    assert result.exit_code == 0, result.output
    assert "Skipped: 1 duplicate, 0 unreadable, 0 without tags" in result.output
    assert len(read_posts(src / "dataset.sqlite")) == 1


def test_extensions_filter(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "a")
    put(src, "b.jpg", image_bytes("JPEG"), "b")
    result = invoke(src, dataset, "--extensions", "jpg")
    assert result.exit_code == 0, result.output
    assert [p[3] for p in read_posts(dataset / "dataset.sqlite")] == ["b"]
    result = invoke(src, tmp_path / "d2", "--extensions", "jpg,tiff")
    assert result.exit_code == 2 and "--extensions: tiff not supported" in result.output


def test_nothing_importable_is_an_error_and_writes_nothing(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"))
    result = invoke(src, dataset)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: {src}: no image could be imported (1 without tags, 0 unreadable, 0 duplicates)")
    assert not (dataset / "dataset.sqlite").exists()
    assert not (dataset / "images").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(empty, dataset)
    assert result.exit_code == 2 and f"error: {empty}: no image files (png, jpg" in result.output


def test_failure_midway_takes_back_copied_images(tmp_path, monkeypatch):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    for index in range(3):
        put(src, f"{index}.png", image_bytes("PNG", color=(index, 0, 0)), f"t{index}")
    original = importer._Placer.place
    calls = []

    def place(self, *args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        original(self, *args)

    monkeypatch.setattr(importer._Placer, "place", place)
    with pytest.raises(KeyboardInterrupt):
        importer.import_images(src, dataset, echo=lambda line: None, warn=lambda line: None)
    assert not dataset.exists()


def test_existing_database_with_missing_columns(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "a")
    dataset.mkdir()
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT)")
    connection.commit()
    connection.close()
    result = invoke(src, dataset)
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {dataset / 'dataset.sqlite'}: posts: missing column(s): "
                                     "file_ext, tag_string, tag_count_general")
    assert not (dataset / "images").exists()

    (dataset / "dataset.sqlite").write_bytes(b"garbage" * 200)
    result = invoke(src, dataset)
    assert result.exit_code == 2 and "not a readable SQLite database" in result.output


def test_import_then_make_tags_round_trip(tmp_path):
    src, dataset, project = tmp_path / "src", tmp_path / "dataset", tmp_path / "project"
    captions = ["cat, indoors", "cat, outdoors, sky", "dog outdoors", "cat sky rating:explicit"]
    for index, caption in enumerate(captions):
        put(src, f"{index}.jpg", image_bytes("JPEG", color=(40 * index, 0, 0)), caption)
    assert invoke(src, dataset).exit_code == 0
    assert CliRunner().invoke(main, ["create-project", str(project)]).exit_code == 0
    config = json.loads((project / "project.json").read_text())
    # No validation split: make-tags counts training posts only, and this test wants every tag of the four.
    config.update(database_path=str(dataset / "dataset.sqlite"), minimum_tag_count=1, validation_fraction=0.0)
    (project / "project.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["make-tags", str(project)])
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == ["cat", "outdoors", "sky", "dog", "indoors", "rating:explicit"]
    records = load_records(dataset / "dataset.sqlite", 1)
    assert len(records) == 4
    for path in records.paths():
        with Image.open(path) as image:
            assert image.format == "JPEG"


def test_next_steps_give_a_database_path_that_works_when_pasted(tmp_path, monkeypatch):
    """Without a project.json the advice is create-project --database; with one, the database_path to set,
    relative to the project folder (as project.json resolves it), and the formats image_extensions lacks."""
    from deepdanbooru.project.config import load_config

    monkeypatch.chdir(tmp_path)
    put(tmp_path / "src", "a.png", image_bytes("PNG"), "a")
    put(tmp_path / "src", "b.webp", image_bytes("WEBP", color=(3, 3, 3)), "b")
    (tmp_path / "work" / "project").mkdir(parents=True)
    result = invoke("src", "my data", "--project-path", "work/project")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index("Next: create the project from the dataset, then run")
    assert lines[start + 1:start + 4] == ["  deepdanbooru create-project work/project --database 'my data/dataset.sqlite'",
                                          "  deepdanbooru make-tags work/project",
                                          "  deepdanbooru train-project work/project"]
    created = CliRunner().invoke(main, ["create-project", "work/project", "--database", "my data/dataset.sqlite"])
    assert created.exit_code == 0, created.output
    config = load_config(tmp_path / "work" / "project")
    assert config.require_database().resolve() == (tmp_path / "my data" / "dataset.sqlite").resolve()
    assert "webp" in config.image_extensions

    put(tmp_path / "src2", "c.gif", image_bytes("GIF", color=(7, 7, 7)), "c")
    put(tmp_path / "src2", "d.webp", image_bytes("WEBP", color=(8, 8, 8)), "d")
    result = invoke("src2", "other", "--project-path", "work/project")
    assert ('Next: set "database_path": "../../other/dataset.sqlite" and image_extensions: '
            '["png", "jpg", "jpeg", "webp", "gif"] in work/project/project.json, then run') in result.output.splitlines()
    assert "note: 1 imported image is gif, not png/jpg: add gif to image_extensions in project.json" in result.output
    result = invoke("src2", "third")
    assert "  deepdanbooru create-project PROJECT --database third/dataset.sqlite" in result.output.splitlines()
    # Imported again into the dataset the project uses: nothing to set.
    result = invoke("src", "my data", "--project-path", "work/project")
    assert "Next: work/project/project.json uses this dataset already; run" in result.output.splitlines()


def test_a_caption_separator_no_caption_holds_is_refused_before_a_picture_is_placed(tmp_path, monkeypatch):
    """The captions are read first (until one holds the separator), so a refusal decodes and writes no picture,
    and the right separator reads one caption more."""
    placed, read = [], []
    place, parse = importer._Placer.place, importer.parse_caption
    monkeypatch.setattr(importer._Placer, "place", lambda self, *args: placed.append(args) or place(self, *args))
    monkeypatch.setattr(importer, "parse_caption", lambda text, separator: read.append(text) or parse(text,
                                                                                                    separator))
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "smile | cat")
    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)), "dog")
    refused = invoke(src, dataset, "--caption-separator", ";")
    assert refused.exit_code == 2 and "none of the 2 caption files read holds ';'" in refused.stderr
    assert placed == [] and not dataset.exists()
    read.clear()
    result = invoke(src, dataset, "--caption-separator", "|")
    assert result.exit_code == 0, result.output
    assert [post[3] for post in read_posts(dataset / "dataset.sqlite")] == ["smile cat", "dog"]
    assert read == ["smile | cat", "smile | cat", "dog"] and len(placed) == 2


def test_a_caption_separator_no_caption_holds_when_every_caption_split_at_spaces(tmp_path):
    src, dataset = tmp_path / "src", tmp_path / "dataset"
    put(src, "a.png", image_bytes("PNG"), "grinning face, face\n")
    put(src, "b.png", image_bytes("PNG", color=(5, 5, 5)), "sun, travel places")
    refused = invoke(src, dataset, "--caption-separator", "|")
    assert refused.exit_code != 0 and not dataset.exists()
    assert refused.stderr == (
        f"error: {src}: --caption-separator '|': none of the 2 caption files read holds '|': each was split at "
        "spaces or line breaks instead; give the separator your captions use (',' when the option is left out)\n")
