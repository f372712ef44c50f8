"""import-images from tar shards in the WebDataset layout (pictures with .json post objects or .txt captions)."""

import gzip
import hashlib
import io
import json
import sqlite3
import sys
import tarfile

import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.dataset.tar_shards import split_key


def picture(seed, fmt="PNG"):
    image = Image.new("RGB", (12, 10), (seed * 37 % 256, seed * 91 % 256, seed * 13 % 256))
    image.putpixel((seed % 12, 0), (255, 255, 255))
    stream = io.BytesIO()
    image.save(stream, fmt)
    return stream.getvalue()


def post(i, **changes):
    item = {"id": 1000 + i, "md5": "0" * 32, "file_ext": "png", "rating": "gsqe"[i % 4],
            "tag_string": f"smile tag_{i} artist_{i}", "tag_string_general": f"smile tag_{i}",
            "tag_string_artist": f"artist_{i}", "tag_count_general": 2, "is_deleted": False}
    item.update(changes)
    return item


def write_shard(path, members, compress=False):
    """members: (name, bytes) in order, as a WebDataset writer lays them out."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    data = stream.getvalue()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def json_sample(i, key=None, **changes):
    key = key or f"{i:06d}"
    return [(f"{key}.png", picture(i)), (f"{key}.json", json.dumps(post(i, **changes)).encode())]


def caption_sample(i, text, key=None):
    key = key or f"{i:06d}"
    return [(f"{key}.jpg", picture(i, "JPEG")), (f"{key}.txt", text.encode())]


def invoke(*args):
    return CliRunner().invoke(main, ["import-images", *map(str, args)])


def posts(dataset):
    connection = sqlite3.connect(dataset / "dataset.sqlite")
    try:
        return connection.execute("SELECT id, md5, file_ext, tag_string, tag_count_general, rating, is_deleted "
                                  "FROM posts ORDER BY id").fetchall()
    finally:
        connection.close()


def test_split_key_follows_webdataset():
    assert split_key("a/b/0001.jpg") == ("a/b/0001", "jpg")
    assert split_key("0001.seg.PNG") == ("0001", "seg.png")
    assert split_key("README") == ("README", "")


def test_post_objects_and_captions_become_posts_under_the_real_md5(tmp_path):
    shard = write_shard(tmp_path / "shard-000.tar", [*json_sample(1), *caption_sample(2, "Long Hair, (smile:1.2)")])
    dataset = tmp_path / "dataset"
    result = invoke(shard, dataset)
    assert result.exit_code == 0, result.output
    rows = posts(dataset)
    png, jpeg = picture(1), picture(2, "JPEG")
    assert rows == [
        (1, hashlib.md5(png).hexdigest(), "png", "smile tag_1 artist_1 rating:sensitive", 2, "s", 0),
        (2, hashlib.md5(jpeg).hexdigest(), "jpg", "long_hair smile", 2, None, 0)]
    for (_, md5, ext, *_), data in zip(rows, (png, jpeg)):
        assert (dataset / "images" / md5[:2] / f"{md5}.{ext}").read_bytes() == data
    assert "Imported 2 images" in result.output and "Skipped: 0 duplicates, 0 unreadable, 0 without tags" in \
        result.output


def test_danbooru20xx_post_objects_and_a_caption_beside_a_post_object(tmp_path):
    old = {"id": "7", "rating": "q", "tags": [{"name": "long hair", "category": "0"},
                                              {"name": "someone", "category": "1"}]}
    shard = write_shard(tmp_path / "s.tar", [("7.webp", picture(7, "WEBP")), ("7.json", json.dumps(old).encode()),
                                             ("7.txt", b"ignored, caption")])
    result = invoke(shard, tmp_path / "d")
    assert result.exit_code == 0, result.output
    # The post object wins over the caption: it carries the categories and the rating.
    assert posts(tmp_path / "d")[0][2:6] == ("webp", "long_hair someone rating:questionable", 1, "q")
    assert "1 imported image is webp, not png/jpg" in result.output


def test_several_shards_and_folders_of_them_in_name_order(tmp_path):
    folder = tmp_path / "shards"
    (folder / "b").mkdir(parents=True)
    write_shard(folder / "b" / "001.tar", json_sample(3))
    write_shard(folder / "000.tar", json_sample(2))
    write_shard(folder / ".hidden.tar", json_sample(9))
    (folder / "notes.md").write_text("not a shard")
    single = write_shard(tmp_path / "z.tar.gz", json_sample(4), compress=True)
    result = invoke(folder, single, tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert [row[3].split()[1] for row in posts(tmp_path / "d")] == ["tag_2", "tag_3", "tag_4"]


def test_problems_are_named_and_counted_and_the_rest_is_imported(tmp_path):
    members = [
        *json_sample(1),
        ("000002.png", picture(2)),  # no pair
        ("000003.json", json.dumps(post(3)).encode()),  # no picture
        ("000004.png", b"\x89PNG not really"), ("000004.txt", b"a, b"),  # unreadable picture
        ("000005.png", picture(5)), ("000005.json", b"{\"id\": 5, "),  # malformed post object
        ("000006.png", picture(6)), ("000006.json", json.dumps({"id": 6, "score": 1}).encode()),  # no tags field
        ("000007.png", picture(7)), ("000007.txt", b"caf\xe9"),  # caption not UTF-8
        ("000008.png", picture(8)), ("000008.txt", b"  \n"),  # empty caption
        ("000009.png", picture(1)), ("000009.txt", b"copy"),  # same bytes as sample 1
        ("000010.cls", b"3"), ("000010.png", picture(10)), ("000010.txt", b"last"),  # unknown members are ignored
    ]
    shard = write_shard(tmp_path / "s.tar", members)
    result = invoke(shard, tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert [row[3] for row in posts(tmp_path / "d")] == ["smile tag_1 artist_1 rating:sensitive", "last"]
    for line in (f"warning: {shard}:000002.png: skipped: no .json post object or .txt caption beside it",
                 f"warning: {shard}:000003.json: skipped: no picture beside it",
                 f"warning: {shard}:000004.png: unreadable image skipped:",
                 f"warning: {shard}:000005.json: not a JSON post object (",
                 f"warning: {shard}:000006.json: post has no tag_string, tag_string_general ... tag_string_meta "
                 "or tags",
                 f"warning: {shard}:000007.txt: is not UTF-8 text (byte at offset 3)",
                 f"warning: {shard}:000008.png: skipped: 000008.txt holds no tags",
                 f"note: {shard}:000009.png: same bytes as {shard}:000001.png, skipped",
                 "Skipped: 1 duplicate, 1 unreadable, 3 without tags, 3 malformed"):
        assert line in result.output, line
    assert "Traceback" not in result.output


def test_a_truncated_shard_is_named_with_its_last_good_member(tmp_path):
    whole = write_shard(tmp_path / "whole.tar", [*json_sample(1), *json_sample(2), *json_sample(3)])
    data = whole.read_bytes()
    cuts = {"in the data": data.index(picture(3)) + 20, "between members": data.index(picture(3)) - 512}
    for how, cut in cuts.items():
        shard = tmp_path / f"cut-{cut}.tar"
        shard.write_bytes(data[:cut])
        later = write_shard(tmp_path / f"later-{cut}.tar", json_sample(4))
        dataset = tmp_path / f"d-{cut}"
        result = invoke(shard, later, dataset)
        assert result.exit_code == 0, (how, result.output)
        assert f"warning: {shard}: is truncated or damaged after member 000002.json" in result.output, how
        assert [row[3].split()[1] for row in posts(dataset)] == ["tag_1", "tag_2", "tag_4"], how
        assert "1 malformed" in result.output


def test_a_file_that_is_not_a_tar_is_named_and_others_imported(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is no tar archive" * 40)
    good = write_shard(tmp_path / "good.tar", json_sample(1))
    result = invoke(bad, good, tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert f"warning: {bad}: is truncated or damaged before its first member" in result.output
    assert len(posts(tmp_path / "d")) == 1


def test_refusals_leave_nothing_behind(tmp_path):
    shard = write_shard(tmp_path / "s.tar", json_sample(1))
    result = invoke("--link", shard, tmp_path / "d")
    assert result.exit_code == 2 and "--link: a picture inside a tar shard cannot be hard-linked" in result.output
    other = tmp_path / "posts.zip"
    other.write_bytes(b"PK")
    result = invoke(other, tmp_path / "d")
    assert result.exit_code == 2 and f"{other}: is a file but not a .tar shard" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke(shard, empty, tmp_path / "d")
    assert result.exit_code == 2 and f"{empty}: holds no .tar shards" in result.output
    useless = write_shard(tmp_path / "u.tar", [("1.png", picture(1)), ("2.json", b"{}")])
    result = invoke(useless, tmp_path / "d")
    assert result.exit_code == 2 and "no image could be imported (2 without tags" in result.output
    assert not (tmp_path / "d").exists()
    assert "Traceback" not in result.output


def test_a_folder_of_pictures_with_a_shard_beside_them_stays_a_folder_import(tmp_path):
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "a.png").write_bytes(picture(1))
    (folder / "a.txt").write_text("one, two")
    write_shard(folder / "extra.tar", json_sample(2))
    result = invoke(folder, tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert [row[3] for row in posts(tmp_path / "d")] == ["one two"]
    assert f"note: {folder}: holds pictures, read as a folder of pictures; its 1 .tar shard(s) are not read" in \
        result.output


def test_reimport_into_the_dataset_skips_known_pictures_and_updates_changed_tags(tmp_path):
    dataset = tmp_path / "d"
    assert invoke(write_shard(tmp_path / "a.tar", [*json_sample(1), *caption_sample(2, "x, y")]),
                  dataset).exit_code == 0
    result = invoke(write_shard(tmp_path / "b.tar", [*json_sample(1), *caption_sample(2, "x, z"),
                                                     *json_sample(3)]), dataset)
    assert result.exit_code == 0, result.output
    assert [row[3] for row in posts(dataset)] == ["smile tag_1 artist_1 rating:sensitive", "x z",
                                                  "smile tag_3 artist_3 rating:explicit"]
    assert "Updated the tags of 1 image" in result.output and "Skipped: 1 duplicate" in result.output


def test_samples_split_apart_are_each_named_as_without_a_pair(tmp_path):
    """WebDataset reads a sample's members together; the members of one key must stand next to each other."""
    members = [("1.png", picture(1)), *json_sample(2), ("1.json", json.dumps(post(1)).encode())]
    result = invoke(write_shard(tmp_path / "s.tar", members), tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert len(posts(tmp_path / "d")) == 1
    assert "s.tar:1.png: skipped: no .json post object or .txt caption beside it" in result.output
    assert "s.tar:1.json: skipped: no picture beside it" in result.output


def test_same_posts_as_the_folder_road(tmp_path, sample_dataset):
    """The repo's sample pictures as loose files with captions and as a shard give the same dataset."""
    database, _ = sample_dataset
    connection = sqlite3.connect(database)
    rows = connection.execute("SELECT md5, file_ext, tag_string FROM posts ORDER BY id").fetchall()
    connection.close()
    folder, members = tmp_path / "loose", []
    folder.mkdir()
    for index, (md5, ext, tags) in enumerate(rows):
        data = (database.parent / "images" / md5[:2] / f"{md5}.{ext}").read_bytes()
        (folder / f"{index:04d}.{ext}").write_bytes(data)
        (folder / f"{index:04d}.txt").write_text(", ".join(tags.split()))
        members += [(f"{index:04d}.{ext}", data), (f"{index:04d}.txt", ", ".join(tags.split()).encode())]
    assert invoke(folder, tmp_path / "from-folder").exit_code == 0
    result = invoke(write_shard(tmp_path / "s.tar", members), tmp_path / "from-shard")
    assert result.exit_code == 0, result.output
    assert posts(tmp_path / "from-folder") == posts(tmp_path / "from-shard")
    assert len(posts(tmp_path / "from-shard")) == len(rows)


def test_the_dataset_modules_need_no_tensorflow():
    import subprocess

    code = "import sys, deepdanbooru.dataset.tar_shards; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("compress", [False, True])
def test_a_shard_read_in_one_pass_whatever_its_compression(tmp_path, compress):
    shard = write_shard(tmp_path / ("s.tar.gz" if compress else "s.tar"), [*json_sample(1), *json_sample(2)],
                        compress=compress)
    result = invoke(shard, tmp_path / "d")
    assert result.exit_code == 0, result.output
    assert len(posts(tmp_path / "d")) == 2 and "malformed" not in result.output


def test_an_interrupted_shard_import_takes_back_what_it_wrote(tmp_path, monkeypatch):
    from deepdanbooru.dataset import tar_shards

    calls = []

    def interrupted(text, separator):
        calls.append(text)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return ["a"]

    monkeypatch.setattr(tar_shards, "parse_caption", interrupted)
    shard = write_shard(tmp_path / "s.tar", [*caption_sample(1, "a"), *caption_sample(2, "b")])
    with pytest.raises(KeyboardInterrupt):
        from deepdanbooru.dataset.import_images import import_images

        import_images(shard, tmp_path / "d", echo=lambda line: None, warn=lambda line: None)
    assert not (tmp_path / "d").exists()


def test_group_duplicates_from_shards(tmp_path):
    shard = write_shard(tmp_path / "s.tar", [*json_sample(1), *json_sample(2)])
    result = invoke(shard, tmp_path / "d", "--group-duplicates")
    assert result.exit_code == 0, result.output
    connection = sqlite3.connect(tmp_path / "d" / "dataset.sqlite")
    assert "split_id" in {row[1] for row in connection.execute("PRAGMA table_info(posts)")}
    connection.close()


def test_a_caption_separator_no_caption_in_the_shards_holds_is_refused_before_a_picture_is_written(tmp_path,
                                                                                                 monkeypatch):
    """The folder road's check, on the captions a shard holds (post objects are not captions): refused after a
    first pass over the captions, before any picture is placed or the database written."""
    from deepdanbooru.dataset import import_images

    placed = []
    place = import_images._Placer.place
    monkeypatch.setattr(import_images._Placer, "place", lambda self, *args: placed.append(args) or place(self, *args))
    shard = write_shard(tmp_path / "s.tar", [*caption_sample(1, "smile,cat\n"), *json_sample(2),
                                             *caption_sample(3, "grinning face, face")])
    dataset = tmp_path / "d"
    refused = invoke(shard, dataset, "--caption-separator", "|")
    assert refused.exit_code == 2 and not dataset.exists() and placed == []
    assert refused.output == (
        f"error: {shard}: --caption-separator '|': none of the 2 caption files read holds '|': 1 of them was read as "
        "one tag (s.tar:000001.txt: 'smile,cat') and the others split at spaces or line breaks; give the separator "
        "your captions use (',' when the option is left out)\n")
    assert invoke(shard, dataset).exit_code == 0 and len(posts(dataset)) == 3
    before = posts(dataset)
    again = invoke(write_shard(tmp_path / "t.tar", caption_sample(4, "a, b")), dataset, "--caption-separator", ";")
    assert again.exit_code == 2 and "none of the 1 caption file read holds ';'" in again.output
    assert posts(dataset) == before and len(placed) == 3


def test_the_first_caption_holding_the_separator_ends_the_first_pass(tmp_path, monkeypatch):
    """A separator the captions use costs one caption's reading more, not a second pass over the shard."""
    from deepdanbooru.dataset import tar_shards

    read = []
    parse = tar_shards.parse_caption
    monkeypatch.setattr(tar_shards, "parse_caption", lambda text, separator: read.append(text) or parse(text,
                                                                                                         separator))
    shard = write_shard(tmp_path / "s.tar", [*caption_sample(1, "long hair | smile"), *caption_sample(2, "cat"),
                                             *caption_sample(3, "a | b")])
    result = invoke(shard, tmp_path / "d", "--caption-separator", " | ")
    assert result.exit_code == 0, result.output
    assert [row[3] for row in posts(tmp_path / "d")] == ["long_hair smile", "cat", "a b"]
    assert read == ["long hair | smile", "long hair | smile", "cat", "a | b"]


@pytest.mark.parametrize("inside", ["dataset", "."])
def test_a_dataset_inside_the_shards_folder_is_not_taken_for_a_folder_of_pictures(tmp_path, inside):
    # As from a folder of pictures, the dataset may live inside SRC (or be SRC): its own pictures are not SRC's.
    shards = tmp_path / "shards"
    shards.mkdir()
    dataset = shards / inside
    write_shard(shards / "a.tar", json_sample(1) + json_sample(2))
    first = invoke(shards, dataset)
    assert first.exit_code == 0, first.output
    write_shard(shards / "b.tar", json_sample(3))
    again = invoke(shards, dataset)
    assert again.exit_code == 0, again.output
    assert "read as a folder of pictures" not in again.output
    with sqlite3.connect(dataset / "dataset.sqlite") as connection:
        tags = [row[0] for row in connection.execute("SELECT tag_string FROM posts ORDER BY id")]
    assert [tag.split()[1] for tag in tags] == ["tag_1", "tag_2", "tag_3"]
    assert "2 duplicates" in again.output  # a.tar's pictures, already in the dataset
