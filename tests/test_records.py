import sqlite3

import pytest

from deepdanbooru.dataset.records import load_records
from deepdanbooru.errors import DatasetError

COLUMNS = "id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, tag_count_general INTEGER"


def make_db(path, rows, columns=COLUMNS, table="posts"):
    connection = sqlite3.connect(path)
    connection.execute(f"CREATE TABLE {table} ({columns})")
    if rows:
        marks = ", ".join("?" for _ in rows[0])
        connection.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
    connection.commit()
    connection.close()
    return path


def test_eligible_rows_in_id_order_with_paths(tmp_path):
    db = make_db(tmp_path / "db.sqlite", [
        (5, "ccdd", "jpg", "b c", 30),
        (2, "aabb", "png", "a", 20),
        (3, "eeff", "gif", "a", 50),    # not a DeepDanbooru extension
        (4, "1122", "jpeg", "a", 19),   # too few tags
        (1, "3344", "JPG", "a", 40),    # extension is matched exactly, as DeepDanbooru did
    ])
    records = load_records(db, 20)
    assert list(records.ids) == [2, 5]
    assert records.tag_strings == ["a", "b c"]
    assert records.paths() == [f"{tmp_path}/images/aa/aabb.png", f"{tmp_path}/images/cc/ccdd.jpg"]
    assert records.path(1) == records.paths()[1]
    wider = load_records(db, 0, ("png", "jpg", "jpeg", "gif"))
    assert list(wider.ids) == [2, 3, 4, 5]
    sub = wider.subset([3, 0])
    assert list(sub.ids) == [5, 2] and sub.md5s == ["ccdd", "aabb"]


def test_null_tag_string_is_empty(tmp_path):
    db = make_db(tmp_path / "db.sqlite", [(1, "ab", "png", None, 5)])
    assert load_records(db, 0).tag_strings == [""]


@pytest.mark.parametrize("md5, reason", [
    ("../../etc/passwd", "not a safe file name"),
    ("ab/cd", "not a safe file name"),
    ("ab\\cd", "not a safe file name"),
    ("..", "not a safe file name"),
    ("", "md5 is empty"),
    (None, "md5 is empty"),
])
def test_unsafe_md5_rejected_with_row_id(tmp_path, md5, reason):
    db = make_db(tmp_path / "db.sqlite", [(1, "ok", "png", "a", 5), (7, md5, "png", "a", 5)])
    with pytest.raises(DatasetError) as caught:
        load_records(db, 0)
    assert str(caught.value).startswith(f"{db}: posts row id 7: ")
    assert reason in str(caught.value)


def test_an_md5_stored_as_a_number_is_named_as_such():
    # A posts table without column types keeps an integer an integer.
    from deepdanbooru.dataset.records import check_md5

    with pytest.raises(DatasetError, match="db.sqlite: posts row id 7: md5 12345 is not text"):
        check_md5(12345, 7, "db.sqlite")


def test_missing_table(tmp_path):
    db = make_db(tmp_path / "db.sqlite", [], table="images")
    with pytest.raises(DatasetError, match=r"db.sqlite: posts: table not found"):
        load_records(db, 0)


def test_missing_column_named(tmp_path):
    db = make_db(tmp_path / "db.sqlite", [], columns="id INTEGER, md5 TEXT, ext TEXT, tag_string TEXT, tag_count_general INTEGER")
    with pytest.raises(DatasetError, match=r"posts: missing column\(s\): file_ext"):
        load_records(db, 0)


def test_not_a_database(tmp_path):
    path = tmp_path / "db.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatasetError, match="not a readable SQLite database"):
        load_records(path, 0)


def test_missing_database(tmp_path):
    with pytest.raises(DatasetError, match="database file not found"):
        load_records(tmp_path / "none.sqlite", 0)


def test_bound_parameters_not_interpolated(tmp_path):
    db = make_db(tmp_path / "db.sqlite", [(1, "ab", "png", "a", 5)])
    # An extension that would break string-built SQL is just a value that matches nothing.
    assert len(load_records(db, 0, ("png') OR 1=1 --",))) == 0


@pytest.mark.parametrize("folder", ["a?b", "c#d", "e%41f"])
def test_a_database_in_a_folder_whose_name_holds_uri_characters_is_read_and_nothing_else_is_made(tmp_path, folder):
    # A raw '?' or '#' ended the URI's path at the folder's name: SQLite opened (and created) another file.
    (tmp_path / folder).mkdir()
    db = make_db(tmp_path / folder / "db.sqlite", [(1, "aabb", "jpg", "a b", 2)])
    before = sorted(path.name for path in tmp_path.iterdir())
    records = load_records(db, 0)
    assert list(records.ids) == [1] and records.tag_strings == ["a b"]
    assert sorted(path.name for path in tmp_path.iterdir()) == before
