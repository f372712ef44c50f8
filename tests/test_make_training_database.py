import os
import sqlite3

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset.build import make_training_database, with_rating_tag

FULL_COLUMNS = ("id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER, "
                "rating TEXT, score INTEGER, is_deleted INTEGER")


def make_source(path, rows, columns=FULL_COLUMNS):
    connection = sqlite3.connect(path)
    connection.execute(f"CREATE TABLE posts ({columns})")
    width = len(columns.split(","))
    connection.executemany(f"INSERT INTO posts VALUES ({', '.join('?' * width)})", rows)
    connection.commit()
    connection.close()
    return path


def read_posts(path, columns="id, md5, file_ext, tag_string, tag_count_general"):
    connection = sqlite3.connect(path)
    try:
        return connection.execute(f"SELECT {columns} FROM posts ORDER BY id").fetchall()
    finally:
        connection.close()


def invoke(*args):
    return CliRunner().invoke(main, ["make-training-database", *map(str, args)])


def danbooru_rows(count=10):
    ratings = "gsqe"
    return [(i, f"{i:032x}", "jpg", f"tag_a tag_{i}", 2, ratings[i % 4], i, int(i % 5 == 0))
            for i in range(1, count + 1)]


def test_copies_posts_with_rating_tags_and_skips_deleted(tmp_path):
    source = make_source(tmp_path / "source.sqlite", danbooru_rows())
    output = tmp_path / "out" / "train.sqlite"
    result = invoke(source, output)
    assert result.exit_code == 0, result.output
    posts = read_posts(output)
    assert [p[0] for p in posts] == [1, 2, 3, 4, 6, 7, 8, 9]  # 5 and 10 deleted
    by_id = {p[0]: p for p in posts}
    assert by_id[1] == (1, f"{1:032x}", "jpg", "tag_a tag_1 rating:sensitive", 2)
    assert by_id[2][3].endswith(" rating:questionable")
    assert by_id[3][3].endswith(" rating:explicit")
    assert by_id[4][3].endswith(" rating:general")
    assert all(p[4] == 2 for p in posts)  # tag_count_general kept as is
    assert "Wrote 8 posts" in result.output and "skipped 2 deleted" in result.output
    # The output uses our full layout, so it can itself be a source again.
    assert read_posts(output, "rating, score, is_deleted")[0] == ("s", 1, 0)


def test_use_deleted_and_id_range(tmp_path):
    source = make_source(tmp_path / "source.sqlite", danbooru_rows())
    output = tmp_path / "train.sqlite"
    result = invoke(source, output, "--use-deleted", "--start-id", 3, "--end-id", 7)
    assert result.exit_code == 0, result.output
    assert [p[0] for p in read_posts(output)] == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 100])
def test_chunked_copy_equals_single_chunk(tmp_path, chunk_size):
    # Ids with gaps, so chunk boundaries fall on missing ids too.
    rows = [(i, f"m{i}", "png", f"t{i}", 1, "g", 0, 0) for i in (1, 2, 5, 9, 10, 11, 40, 41)]
    source = make_source(tmp_path / "source.sqlite", rows)
    output = tmp_path / f"train{chunk_size}.sqlite"
    lines = []
    make_training_database(source, output, chunk_size=chunk_size, echo=lines.append, progress=lines.append)
    assert [p[0] for p in read_posts(output)] == [1, 2, 5, 9, 10, 11, 40, 41]
    if chunk_size < 8:
        assert any(line.startswith("read ") and "of 8 posts" in line for line in lines)


def test_rating_tag_not_added_twice_when_run_on_its_own_output(tmp_path):
    source = make_source(tmp_path / "source.sqlite", danbooru_rows(4))
    first, second = tmp_path / "first.sqlite", tmp_path / "second.sqlite"
    assert invoke(source, first).exit_code == 0
    assert invoke(first, second).exit_code == 0
    assert read_posts(first) == read_posts(second)


def test_with_rating_tag():
    assert with_rating_tag("a b", "e") == ("a b rating:explicit", "rating:explicit")
    assert with_rating_tag(None, "G") == ("rating:general", "rating:general")
    assert with_rating_tag("a", None) == ("a", None)
    assert with_rating_tag("a", "x") == ("a", None)
    assert with_rating_tag("a rating:general", "g") == ("a rating:general", "rating:general")


def test_source_without_rating_and_is_deleted_columns(tmp_path):
    columns = "id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER"
    source = make_source(tmp_path / "dd.sqlite", [(1, "aa", "jpg", "x y", 2), (2, "bb", "png", "z", 1)], columns)
    output = tmp_path / "train.sqlite"
    result = invoke(source, output)
    assert result.exit_code == 0, result.output
    assert read_posts(output) == [(1, "aa", "jpg", "x y", 2), (2, "bb", "png", "z", 1)]
    assert "no rating column" in result.output and "no is_deleted column" in result.output


def test_text_is_deleted_values_and_unsafe_md5_rows(tmp_path):
    columns = ("id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER, "
               "rating TEXT, score INTEGER, is_deleted TEXT")
    rows = [(1, "aa", "jpg", "x", 1, "g", 0, "false"), (2, "bb", "jpg", "x", 1, "g", 0, "true"),
            (3, None, "jpg", "x", 1, "g", 0, "f"), (4, "../etc", "jpg", "x", 1, "g", 0, None)]
    source = make_source(tmp_path / "s.sqlite", rows, columns)
    output = tmp_path / "o.sqlite"
    result = invoke(source, output)
    assert result.exit_code == 0, result.output
    assert [p[0] for p in read_posts(output)] == [1]
    assert "skipped 1 deleted, 2 with an empty or unsafe md5 (first: id 3)" in result.output


def test_missing_required_column_is_named(tmp_path):
    source = make_source(tmp_path / "s.sqlite", [(1, "aa", "jpg")], "id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT")
    output = tmp_path / "o.sqlite"
    result = invoke(source, output)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == \
        f"error: {source}: posts: missing column(s): tag_string, tag_count_general"
    assert not output.exists()
    assert os.listdir(tmp_path) == ["s.sqlite"]


def test_same_path_refused_also_through_other_spellings(tmp_path):
    source = make_source(tmp_path / "s.sqlite", danbooru_rows(2))
    before = source.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.sqlite").symlink_to(source)
    for spelling in (source, tmp_path / "sub" / ".." / "s.sqlite", tmp_path / "link.sqlite"):
        result = invoke(source, spelling, "--overwrite")
        assert result.exit_code == 2
        assert "is the source database" in result.output
    assert source.read_bytes() == before


def test_existing_output_needs_overwrite(tmp_path):
    source = make_source(tmp_path / "s.sqlite", danbooru_rows(3))
    output = tmp_path / "o.sqlite"
    output.write_text("keep me")
    result = invoke(source, output)
    assert result.exit_code == 2
    assert f"error: {output}: already exists; use --overwrite to replace it" in result.output
    assert output.read_text() == "keep me"
    result = invoke(source, output, "--overwrite", "--vacuum")
    assert result.exit_code == 0, result.output
    assert len(read_posts(output)) == 3


def test_failure_midway_leaves_no_output_and_no_temporary(tmp_path):
    source = make_source(tmp_path / "s.sqlite", danbooru_rows(6))
    output = tmp_path / "o.sqlite"
    output.write_text("old")
    calls = []

    def failing_progress(line):
        calls.append(line)
        if line.startswith("read "):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_training_database(source, output, chunk_size=2, overwrite=True, progress=failing_progress,
                               echo=lambda line: None)
    assert output.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["o.sqlite", "s.sqlite"]


def test_duplicate_ids_in_a_source_without_primary_key(tmp_path):
    columns = "id INTEGER, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER"
    source = make_source(tmp_path / "s.sqlite", [(1, "aa", "jpg", "x", 1), (2, "bb", "jpg", "x", 1),
                                                 (2, "cc", "jpg", "y", 1)], columns)
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 2
    assert f"error: {source}: posts row id 2: id occurs more than once" in result.output
    assert not (tmp_path / "o.sqlite").exists()


@pytest.mark.parametrize("row, field", [
    ((2, f"{2:032x}", "jpg", b"\xff\xfe\x00", 1), "tag_string is not text"),
    ((2, f"{2:032x}", "jpg", "x", "many"), "tag_count_general 'many' is not a number"),
])
def test_a_row_whose_tags_or_count_are_not_what_sqlite_types_say_is_refused(tmp_path, row, field):
    columns = "id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string, tag_count_general"
    source = make_source(tmp_path / "s.sqlite", [(1, f"{1:032x}", "jpg", "x", 1), row], columns)
    result = invoke(source, tmp_path / "o.sqlite")
    assert result.exit_code == 2 and result.output.splitlines()[-1] == f"error: {source}: posts row id 2: {field}"
    assert sorted(os.listdir(tmp_path)) == ["s.sqlite"]


def test_non_integer_ids_are_skipped_with_a_warning(tmp_path):
    columns = "id, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER"
    source = make_source(tmp_path / "s.sqlite", [(1, "aa", "jpg", "x", 1), ("x7", "bb", "jpg", "x", 1),
                                                 (2.5, "cc", "jpg", "x", 1)], columns)
    output = tmp_path / "o.sqlite"
    result = invoke(source, output)
    assert result.exit_code == 0, result.output
    assert [p[0] for p in read_posts(output)] == [1]
    assert "2 posts row(s) with a non-integer id are skipped" in result.output


def test_bad_inputs(tmp_path):
    not_sqlite = tmp_path / "n.sqlite"
    not_sqlite.write_bytes(b"this is not sqlite" * 100)
    result = invoke(not_sqlite, tmp_path / "o.sqlite")
    assert result.exit_code == 2 and "not a readable SQLite database" in result.output

    source = make_source(tmp_path / "s.sqlite", danbooru_rows(2))
    result = invoke(source, tmp_path / "o.sqlite", "--start-id", 9, "--end-id", 3)
    assert result.exit_code == 2 and "--start-id 9 is greater than --end-id 3" in result.output

    empty = sqlite3.connect(tmp_path / "e.sqlite")
    empty.execute("CREATE TABLE other (x)")
    empty.close()
    result = invoke(tmp_path / "e.sqlite", tmp_path / "o.sqlite")
    assert result.exit_code == 2 and f"{tmp_path / 'e.sqlite'}: posts: table not found" in result.output

    result = invoke(tmp_path / "missing.sqlite", tmp_path / "o.sqlite")
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "o.sqlite").exists()


def test_sample_dataset_round_trip(tmp_path, sample_dataset):
    database, _ = sample_dataset
    source = read_posts(database, "id, tag_string, rating, is_deleted")
    output = tmp_path / "train.sqlite"
    result = invoke(database, output)
    assert result.exit_code == 0, result.output
    names = {"g": "general", "s": "sensitive", "q": "questionable", "e": "explicit"}
    expected = [(i, f"{tags} rating:{names[r]}") for i, tags, r, deleted in source if not deleted]
    assert read_posts(output, "id, tag_string") == expected
    assert output.stat().st_size > 0 and f"Wrote {len(expected)} posts" in result.output
