"""evaluate / evaluate-project: targets, order, thresholds, output formats, errors."""

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.errors import ModelError
from deepdanbooru.inference.output import CsvWriter, JsonLinesWriter, TextWriter, select_tags, threshold_vector
from deepdanbooru.inference.targets import TargetError, collect_targets, natural_key, sidecar_path


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def touch(path, content=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


# --- targets and order (no TensorFlow) ---


def test_natural_order():
    names = ["img10.png", "img2.png", "Img1.png", "img1.png", "a.png", "img2b.png", "10.png", "9.png"]
    assert sorted(names, key=natural_key) == [
        "9.png", "10.png", "a.png", "Img1.png", "img1.png", "img2.png", "img2b.png", "img10.png"]


def test_folders_are_walked_recursively_with_filters_in_natural_order(tmp_path):
    for name in ["b/img10.PNG", "b/img2.jpg", "b/deep/x1.webp", "a10/z.jpeg", "a2/z.gif", "notes.txt",
                 "b/img3.tiff", "top.BMP"]:
        touch(tmp_path / name)
    found = collect_targets([tmp_path], allow_folder=True)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "a2/z.gif", "a10/z.jpeg", "b/deep/x1.webp", "b/img2.jpg", "b/img10.PNG", "top.BMP"]
    only_png = collect_targets([tmp_path], allow_folder=True, folder_filters="*.png, *.PNG")
    assert [p.name for p in only_png] == ["img10.PNG"]


def test_files_are_taken_whatever_their_name_and_listed_once(tmp_path):
    image = touch(tmp_path / "photo.tiff")
    other = touch(tmp_path / "x.png")
    found = collect_targets([image, other, tmp_path / "." / "x.png", tmp_path], allow_folder=True)
    assert found == [image, other]


def test_target_errors(tmp_path):
    with pytest.raises(TargetError, match="is a folder; pass --allow-folder"):
        collect_targets([tmp_path])
    with pytest.raises(TargetError, match="missing.png: not found"):
        collect_targets([tmp_path / "missing.png"])
    with pytest.raises(TargetError, match="no pattern"):
        collect_targets([tmp_path], allow_folder=True, folder_filters=" , ")


def test_sidecar_path(tmp_path):
    assert sidecar_path(tmp_path / "a.b.png") == tmp_path / "a.b.txt"


# --- thresholds and formats (no TensorFlow) ---


def write_thresholds(path, rows):
    path.write_text("tag,threshold,precision,recall,f1,support\n" +
                    "".join(f"{tag},{value},0.5,0.5,0.5,3\n" for tag, value in rows))
    return path


def test_threshold_vector_from_csv_with_default_for_missing_tags(tmp_path):
    csv_path = write_thresholds(tmp_path / "m.thresholds.csv", [("b", 0.9), ("a", 0.1)])
    vector = threshold_vector(["a", "b", "c"], 0.5, csv_path)
    np.testing.assert_allclose(vector, [0.1, 0.9, 0.5])
    scores = np.array([0.2, 0.8, 0.5], dtype=np.float32)
    assert select_tags(["a", "b", "c"], scores, vector) == [("a", pytest.approx(0.2)), ("c", 0.5)]


def test_threshold_csv_errors(tmp_path):
    foreign = write_thresholds(tmp_path / "foreign.csv", [("zzz", 0.3)])
    with pytest.raises(ModelError, match="'zzz' is not in the model's tags.txt"):
        threshold_vector(["a"], 0.5, foreign)
    bad = write_thresholds(tmp_path / "bad.csv", [("a", 1.5)])
    with pytest.raises(ModelError, match=r"bad.csv: line 2: threshold 1.5 is not in \[0, 1\]"):
        threshold_vector(["a"], 0.5, bad)


def test_writers():
    pairs = [("red", 0.98765), ("a,b", 0.5)]
    lines = []
    TextWriter(lines.append).image("x.png", pairs)
    assert lines == ["Tags of x.png:\n(0.988) red\n(0.500) a,b\n"]
    lines = []
    JsonLinesWriter(lines.append).image("x.png", pairs)
    assert json.loads(lines[0]) == {"path": "x.png", "tags": {"red": 0.98765, "a,b": 0.5}}
    lines = []
    writer = CsvWriter(lines.append)
    writer.image("x.png", pairs)
    writer.image("y.png", [])
    assert list(csv.reader(io.StringIO("\n".join(lines)))) == [
        ["path", "tag", "score"], ["x.png", "red", "0.987650"], ["x.png", "a,b", "0.500000"]]


# --- the commands, with a real model ---
