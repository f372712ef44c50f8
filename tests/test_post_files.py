"""make-training-database from Danbooru metadata as JSON Lines, JSON arrays (either gzipped) and Parquet."""

import gzip
import json
import os
import sqlite3
import sys

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset import post_files
from deepdanbooru.dataset.post_files import JSON, PARQUET, SQLITE, PostFile, detect_kind
from test_make_training_database import read_posts

pyarrow = pytest.importorskip("pyarrow")
import pyarrow.parquet as parquet  # noqa: E402

CATEGORIES = ("general", "character", "copyright", "artist", "meta")


def api_post(i, deleted=False, **changes):
    """A post object as Danbooru's /posts.json writes it (a few of its many fields)."""
    post = {"id": i, "created_at": "2020-01-01T00:00:00.000-05:00", "uploader_id": 7, "score": i % 9,
            "md5": f"{i:032x}", "rating": "gsqe"[i % 4], "image_width": 640, "image_height": 480,
            "tag_string": f"tag_a tag_{i % 7} artist_{i % 3}", "file_ext": "png" if i % 2 else "jpg",
            "tag_count_general": 2, "tag_count_artist": 1, "is_deleted": deleted, "file_url": "https://x/y.png",
            "tag_string_general": f"tag_a tag_{i % 7}", "tag_string_artist": f"artist_{i % 3}",
            "tag_string_character": "", "tag_string_copyright": "", "tag_string_meta": ""}
    post.update(changes)
    return post


def posts(count=12):
    return [api_post(i, deleted=i % 5 == 0) for i in range(1, count + 1)]


def write_jsonl(path, items, compress=False):
    text = "".join(json.dumps(item) + "\n" for item in items).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def write_array(path, items, compress=False):
    text = json.dumps(items, indent=1).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return path


def write_parquet(path, items, **options):
    parquet.write_table(pyarrow.Table.from_pylist(items), path, **options)
    return path


def write_sqlite(path, items):
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER, rating TEXT, score INTEGER, is_deleted INTEGER)")
    connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(p["id"], p["md5"], p["file_ext"], p["tag_string"], p["tag_count_general"],
                             p["rating"], p["score"], int(p["is_deleted"])) for p in items])
    connection.commit()
    connection.close()
    return path


WRITERS = {
    "jsonl": lambda path, items: write_jsonl(path, items),
    "jsonl.gz": lambda path, items: write_jsonl(path, items, compress=True),
    "json array": lambda path, items: write_array(path, items),
    "json array gz": lambda path, items: write_array(path, items, compress=True),
    "parquet": lambda path, items: write_parquet(path, items),
}


def invoke(*args):
    return CliRunner().invoke(main, ["make-training-database", *map(str, args)])


def rows(path, columns="id, md5, file_ext, tag_string, tag_count_general, rating, score, is_deleted"):
    return read_posts(path, columns)


def leftovers(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("form", list(WRITERS))
def test_every_format_gives_what_the_sqlite_source_gives(tmp_path, form):
    items = posts()
    expected_output = tmp_path / "from-sqlite.sqlite"
    assert invoke(write_sqlite(tmp_path / "s.sqlite", items), expected_output).exit_code == 0
    # A name that says nothing: the format is read from the content.
    source = WRITERS[form](tmp_path / "posts.dat", items)
    output = tmp_path / "out.sqlite"
    result = invoke(source, output, "--chunk-size", 5)
    assert result.exit_code == 0, result.output
    assert rows(output) == rows(expected_output)
    assert rows(output, "id, tag_string")[0] == (1, "tag_a tag_1 artist_1 rating:sensitive")
    assert "Wrote 10 posts" in result.output and "skipped 2 deleted" in result.output
    assert "rating:general 3, rating:sensitive 2, rating:questionable 2, rating:explicit 3" in result.output
    assert leftovers(tmp_path) == []


def test_detect_kind_reads_the_content_not_the_name(tmp_path):
    items = posts(2)
    assert detect_kind(write_sqlite(tmp_path / "a.json", items)) == SQLITE
    assert detect_kind(write_parquet(tmp_path / "b.jsonl", items)) == PARQUET
    assert detect_kind(write_jsonl(tmp_path / "c.parquet", items, compress=True)) == JSON
    bom = tmp_path / "d.sqlite"
    bom.write_bytes(b"\xef\xbb\xbf \n" + json.dumps(items[0]).encode())
    assert detect_kind(bom) == JSON


def test_category_fields_are_joined_where_tag_string_is_absent(tmp_path):
    items = [{"id": 3, "md5": "c" * 32, "file_ext": "jpg", "rating": "q", "is_deleted": False,
              "tag_string_general": "smile  long_hair", "tag_string_character": "hatsune_miku",
              "tag_string_copyright": "vocaloid", "tag_string_artist": "someone", "tag_string_meta": "highres"}]
    source = write_jsonl(tmp_path / "p.jsonl", items)
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 0, result.output
    assert rows(tmp_path / "o.sqlite", "tag_string, tag_count_general") == [
        ("smile  long_hair hatsune_miku vocaloid someone highres rating:questionable", 2)]


def test_danbooru20xx_layout_tags_as_objects_and_ids_as_strings(tmp_path):
    items = [{"id": str(i), "md5": f"{i:032x}", "file_ext": "jpg", "rating": "s", "score": "4",
              "is_deleted": i == 2, "tags": [{"id": "1", "name": "long hair", "category": "0"},
                                             {"id": "2", "name": "smile", "category": "0"},
                                             {"id": "3", "name": "kantoku", "category": "1"}]}
             for i in (1, 2, 3)]
    for form in ("jsonl.gz", "parquet"):
        output = tmp_path / f"{form}.sqlite"
        result = invoke(WRITERS[form](tmp_path / f"meta-{form}", items), output)
        assert result.exit_code == 0, result.output
        tags = "long_hair smile kantoku rating:sensitive"
        assert rows(output, "id, tag_string, tag_count_general, score") == [(1, tags, 2, 4), (3, tags, 2, 4)]
        assert "skipped 1 deleted" in result.output


def test_without_any_category_every_tag_but_rating_counts_as_general(tmp_path):
    items = [{"id": 1, "md5": "a" * 32, "file_ext": "png", "tag_string": "a b c rating:general"}]
    result = invoke(write_jsonl(tmp_path / "p.jsonl", items), tmp_path / "o.sqlite")
    assert result.exit_code == 0, result.output
    assert rows(tmp_path / "o.sqlite", "tag_string, tag_count_general, is_deleted") == [("a b c rating:general", 3,
                                                                                          None)]
    assert "no post has a rating; no rating system tags are added" in result.output
    assert "no post has is_deleted; every post counts as not deleted" in result.output


@pytest.mark.parametrize("form", ["jsonl.gz", "parquet"])
def test_deleted_unsafe_md5_id_range_and_non_integer_ids(tmp_path, form):
    items = posts(10)
    items[1]["md5"] = "../../etc"
    del items[2]["md5"]  # Danbooru leaves md5 out of posts it hides
    items[3]["id"] = "4b"  # not an integer
    if form == "parquet":  # a column has one type: ids as strings, as the Danbooru20xx dumps write them
        for item in items:
            item["id"] = str(item["id"])
    source = WRITERS[form](tmp_path / "p", items)
    result = invoke(source, tmp_path / "a.sqlite")
    assert result.exit_code == 0, result.output
    assert [row[0] for row in rows(tmp_path / "a.sqlite")] == [1, 6, 7, 8, 9]
    assert "skipped 2 deleted, 2 with an empty or unsafe md5 (first: id 2)" in result.output
    assert "1 post(s) with a non-integer id are skipped" in result.output

    result = invoke(source, tmp_path / "b.sqlite", "--use-deleted", "--start-id", 5, "--end-id", 9, "--chunk-size", 2)
    assert result.exit_code == 0, result.output
    assert rows(tmp_path / "b.sqlite", "id, is_deleted") == [(5, 1), (6, 0), (7, 0), (8, 0), (9, 0)]


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
def test_chunks_bound_what_is_held_and_do_not_change_the_output(tmp_path, chunk_size):
    items = posts(11)
    reference = tmp_path / "ref.sqlite"
    assert invoke(write_sqlite(tmp_path / "s.sqlite", items), reference).exit_code == 0
    for form in ("jsonl", "parquet"):
        source = WRITERS[form](tmp_path / f"p-{form}", items)
        reader = PostFile(source, detect_kind(source))
        sizes = [len(chunk) for chunk in reader.chunks(chunk_size, 1, 2**63 - 1)]
        assert sum(sizes) == 11 and max(sizes) == min(chunk_size, 11)
        output = tmp_path / f"{form}-{chunk_size}.sqlite"
        assert invoke(source, output, "--chunk-size", chunk_size).exit_code == 0
        assert rows(output) == rows(reference)


def test_json_array_items_cut_by_read_blocks(tmp_path, monkeypatch):
    items = posts(6)
    items[2]["tag_string"] = "caf\u00e9 \u6771\u65b9 tag_a"  # multi-byte characters cut between blocks too
    monkeypatch.setattr(post_files, "_READ_BYTES", 7)
    reader = PostFile(write_array(tmp_path / "a.json", items), JSON)
    read = [row for chunk in reader.chunks(4, 1, 100) for row, _ in chunk]
    assert [row[0] for row in read] == [1, 2, 3, 4, 5, 6]
    assert read[2][3] == "caf\u00e9 \u6771\u65b9 tag_a"


@pytest.mark.parametrize("form", ["jsonl", "jsonl.gz", "parquet"])
def test_duplicate_ids_are_named_in_the_same_and_in_a_later_chunk(tmp_path, form):
    items = posts(6)
    items.append(api_post(2))
    where = "row 7" if form == "parquet" else "line 7"
    for chunk_size in (100, 3):
        output = tmp_path / "o.sqlite"
        result = invoke(WRITERS[form](tmp_path / "p", items), output, "--chunk-size", chunk_size)
        assert result.exit_code == 2
        assert f"p: {where}: post id 2 occurs more than once" in result.output
        assert "Traceback" not in result.output and not output.exists() and leftovers(tmp_path) == []


def test_bad_input_gets_one_line_naming_file_and_place_and_leaves_an_old_output(tmp_path):
    output = tmp_path / "o.sqlite"
    output.write_bytes(b"old output")
    good = json.dumps(api_post(1))
    cases = {
        "broken.jsonl": (good + "\n{\"id\": 2, \n").encode(),
        "text.jsonl": (good + "\n" + json.dumps([1, 2]) + "\n").encode(),
        "noext.jsonl": json.dumps({"id": 1, "md5": "a" * 32, "tag_string": "x"}).encode(),
        "notags.jsonl": json.dumps({"id": 1, "md5": "a" * 32, "file_ext": "jpg"}).encode(),
        "badtags.jsonl": json.dumps({"id": 1, "md5": "a" * 32, "file_ext": "jpg", "tags": [{"nom": "x"}]}).encode(),
        "count.jsonl": json.dumps({"id": 1, "md5": "a" * 32, "file_ext": "jpg", "tag_string": "x",
                                   "tag_count_general": "many"}).encode(),
        "latin1.jsonl": good.encode() + b"\n{\"id\": 2, \"tag_string\": \"caf\xe9\"}\n",
        "truncated.jsonl.gz": gzip.compress(("".join(json.dumps(api_post(i)) + "\n" for i in range(1, 400))
                                            ).encode())[:3000],
        "array.json": ("[" + good + " " + good + "]").encode(),
        "openarray.json": ("[" + good + ",").encode(),
        "garbage.bin": b"GIF89a not posts",
        "empty.jsonl": b"",
        "broken.parquet": b"PAR1" + b"\0" * 40,
    }
    expected = {
        "broken.jsonl": "line 2: is not a JSON object: Expecting property name",
        "text.jsonl": "line 2: is not a post object but list",
        "noext.jsonl": "line 1: post has no file_ext",
        "notags.jsonl": "line 1: post has no tag_string, tag_string_general ... tag_string_meta or tags",
        "badtags.jsonl": "line 1: tags holds {'nom': 'x'}, not an object with a name",
        "count.jsonl": "posts row id 1: tag_count_general 'many' is not a number",
        "latin1.jsonl": "line 2: is not a JSON object",
        "truncated.jsonl.gz": "is truncated or damaged after line",
        "array.json": "item 2: expected ',' or ']' after item 1",
        "openarray.json": "ends inside its JSON array after item 1",
        "garbage.bin": "not a readable SQLite database, JSON Lines or Parquet file (content starts with b'GIF89a",
        "empty.jsonl": "not a readable SQLite database, JSON Lines or Parquet file (content is empty)",
        "broken.parquet": "cannot be read as Parquet",
    }
    for name, data in cases.items():
        source = tmp_path / name
        source.write_bytes(data)
        result = invoke(source, output, "--overwrite")
        assert result.exit_code == 2, (name, result.output)
        assert f"{source}: {expected[name]}" in result.output, (name, result.output)
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3, result.output
        assert output.read_bytes() == b"old output" and leftovers(tmp_path) == [], name


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    source = write_parquet(tmp_path / "p.parquet", posts(2))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 2
    assert (f"{source}: is a Parquet file: reading it needs pyarrow; pip install 'deepdanbooru[parquet]'"
            in result.output)
    assert not (tmp_path / "o.sqlite").exists() and leftovers(tmp_path) == []


def test_parquet_in_small_row_groups_and_other_column_types(tmp_path):
    items = posts(9)
    source = write_parquet(tmp_path / "p.parquet", items, row_group_size=2, compression="zstd")
    result = invoke(source, tmp_path / "o.sqlite", "--chunk-size", 4)
    assert result.exit_code == 0, result.output
    assert len(rows(tmp_path / "o.sqlite")) == 8
    assert "read 4 of 9 posts" in result.output


def test_output_is_a_source_again_and_the_module_needs_no_tensorflow(tmp_path):
    first = tmp_path / "first.sqlite"
    assert invoke(write_jsonl(tmp_path / "p.jsonl", posts()), first).exit_code == 0
    second = tmp_path / "second.sqlite"
    assert invoke(first, second).exit_code == 0
    assert rows(first) == rows(second)
    import subprocess

    code = ("import sys, deepdanbooru.dataset.build, deepdanbooru.dataset.post_files; "
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_the_general_count_comes_from_the_general_field_where_the_count_is_absent(tmp_path, form):
    items = [{"id": 1, "md5": "a" * 32, "file_ext": "jpg", "tag_string": "a b c someone",
              "tag_string_general": "a b c", "tag_string_artist": "someone", "rating": "g"}]
    result = invoke(WRITERS[form](tmp_path / "p", items), tmp_path / "o.sqlite")
    assert result.exit_code == 0, result.output
    assert rows(tmp_path / "o.sqlite", "tag_string, tag_count_general") == [("a b c someone rating:general", 3)]


def test_parquet_reads_only_the_columns_a_post_row_needs():
    api = ["id", "md5", "file_ext", "tag_string", "tag_count_general", "rating", "score", "is_deleted",
           "file_url", "tag_string_general", "tag_string_artist", "source"]
    assert post_files.parquet_columns(api) == ["id", "md5", "file_ext", "tag_string", "tag_count_general", "rating",
                                               "score", "is_deleted"]
    no_count = [name for name in api if name != "tag_count_general"]
    assert "tag_string_general" in post_files.parquet_columns(no_count)
    categories = ["id", "md5", "file_ext", "tag_string_general", "tag_string_meta", "tags"]
    assert post_files.parquet_columns(categories) == ["id", "md5", "file_ext", "tag_string_general",
                                                      "tag_string_meta"]
    assert post_files.parquet_columns(["id", "md5", "file_ext", "tags"]) == ["id", "md5", "file_ext", "tags"]


def test_group_duplicates_and_vacuum_with_a_json_source(tmp_path, sample_dataset):
    """A JSON dump beside its images/ folder: --group-duplicates reads the pictures as for a SQLite source."""
    database, _ = sample_dataset
    connection = sqlite3.connect(database)
    names = ("id", "md5", "file_ext", "tag_string", "tag_count_general", "rating", "score", "is_deleted")
    items = [dict(zip(names, row)) for row in connection.execute(f"SELECT {', '.join(names)} FROM posts")]
    connection.close()
    (tmp_path / "dump").mkdir()
    source = write_jsonl(tmp_path / "dump" / "posts.jsonl", items)
    (tmp_path / "dump" / "images").symlink_to(database.parent / "images")
    output = tmp_path / "out" / "train.sqlite"
    result = invoke(source, output, "--group-duplicates", "--vacuum")
    assert result.exit_code == 0, result.output
    reference = tmp_path / "reference.sqlite"
    assert invoke(database, reference).exit_code == 0
    assert rows(output) == rows(reference)
    assert rows(output, "COUNT(*)") == [(len(rows(reference)),)]
    connection = sqlite3.connect(output)
    assert "split_id" in {row[1] for row in connection.execute("PRAGMA table_info(posts)")}
    connection.close()


def test_pretty_printed_post_objects_one_after_another(tmp_path):
    """A post saved from /posts/N.json with indentation, or several such objects: not one a line."""
    items = posts(4)
    source = tmp_path / "post.json"
    source.write_text("\n".join(json.dumps(item, indent=2) for item in items) + "\n")
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 0, result.output
    assert [row[0] for row in rows(tmp_path / "o.sqlite")] == [1, 2, 3, 4]
    source.write_text(json.dumps(items[0], indent=2) + "\n" + json.dumps(items[1], indent=2)[:-3])
    result = invoke(source, tmp_path / "p.sqlite")
    assert result.exit_code == 2 and f"{source}: object 2: is not a JSON object" in result.output


def test_a_truncated_gzipped_array_names_its_last_whole_item(tmp_path):
    data = gzip.compress(json.dumps(posts(300)).encode())
    source = tmp_path / "posts.json.gz"
    source.write_bytes(data[:len(data) // 2])
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 2
    assert f"{source}: is truncated or damaged after item " in result.output
    assert not (tmp_path / "o.sqlite").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("text, said", [('"abc', "Unterminated string starting at character 1"),
                                        ('"a\x01"', "Invalid control character at character 3"),
                                        ("{,}", "Expecting property name enclosed in double quotes at character 2")])
def test_a_json_error_reads_as_one_phrase(text, said):
    import json

    from deepdanbooru.dataset.post_files import short_reason

    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(text)
    assert short_reason(caught.value) == said
