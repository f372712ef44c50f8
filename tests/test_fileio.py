"""Atomic writes: whole files, ordinary permissions, nothing left behind on failure."""

import os

import pytest

from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic


def test_written_whole_with_the_permissions_open_gives(tmp_path):
    previous = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.txt", "one\n")
        with open(tmp_path / "b.txt", "w") as stream:
            stream.write("two\n")
    finally:
        os.umask(previous)
    assert (tmp_path / "a.txt").read_text() == "one\n"
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o644
    write_text_atomic(tmp_path / "a.txt", "replaced\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.bin"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_bytes_atomic(target, "not bytes")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.bin"]


def test_a_folder_that_refuses_the_file_is_reported_with_the_file_s_own_name(tmp_path):
    (tmp_path / "plain").write_text("a file, not a folder")
    target = tmp_path / "plain" / "tags.txt"
    with pytest.raises(NotADirectoryError) as raised:
        write_text_atomic(target, "a\n")
    assert raised.value.filename == str(target) and raised.value.strerror == "Not a directory"
