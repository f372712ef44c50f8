"""evaluate / evaluate-project: targets, order, thresholds, output formats, errors."""

import csv
import io
import json
import os
from pathlib import Path

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


TAGS = ["red", "green", "blue"]


def colour_model():
    """Scores a tag by its colour channel's mean m: sigmoid(20 m - 10), built-in layers only.

    A pure red image scores red 0.99995; a channel at 0.6 scores 0.881.
    """
    keras = pytest.importorskip("keras")
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(3, 1, kernel_initializer=keras.initializers.Constant(20 * np.eye(3).reshape(1, 1, 3, 3)),
                            bias_initializer=keras.initializers.Constant(-10.0), name="head_conv")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Activation("sigmoid", name="output")(x)
    return keras.Model(inputs, outputs)


def sigmoid(x):
    return float(1 / (1 + np.exp(-x)))


def solid(path, rgb, size=(40, 24)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)
    return path


@pytest.fixture(scope="module")
def colour_model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("colour") / "colour.keras"
    colour_model().save(path)
    return path


@pytest.fixture
def project(colour_model_file, exported_project):
    return exported_project(colour_model_file, 32, TAGS)


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "images"
    return {
        "red": solid(folder / "red.png", (255, 0, 0)),
        "yellow": solid(folder / "yellow.png", (153, 153, 0)),  # 0.6 red, 0.6 green
        "green": solid(folder / "deep" / "green.png", (0, 255, 0)),
    }


HIGH, MID, LOW = sigmoid(10), sigmoid(2), sigmoid(-10)


def test_text_output_like_deepdanbooru(project, images):
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"Tags of {images['red']}:\n({HIGH:05.3f}) red\n\n"
        f"Tags of {images['yellow']}:\n({MID:05.3f}) red\n({MID:05.3f}) green\n\n")
    assert result.stderr == (f"Model: {project / 'model-resnet_small.keras'} (the project's final export); "
                             "thresholds: 0.5 for every tag\n")


def test_a_batch_size_beyond_the_pictures_gives_the_same_tags(project, images):
    # Batches are padded to the batch size; no more rows than pictures are made (this one ran out of memory).
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project,
                     "--batch-size", 100_000_000)
    assert result.exit_code == 0, result.output
    assert result.stdout == run_cli("evaluate", images["red"], images["yellow"], "--project-path", project).stdout


def test_the_thresholds_csv_beside_the_model_is_used_unless_threshold_is_given(project, images):
    beside = write_thresholds(project / "model-resnet_small.thresholds.csv", [("red", 0.95), ("green", 0.5)])
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tags"] == {"green": pytest.approx(MID, abs=1e-5)}  # red 0.881 < 0.95
    assert result.stderr.splitlines()[0] == (
        f"Model: {project / 'model-resnet_small.keras'} (the project's final export); thresholds: per tag from "
        f"{beside}: 2 tags (0.5 for tags it does not list; --threshold sets one for every tag)")
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--format", "json", "--threshold", "0.5")
    assert json.loads(result.stdout)["tags"] == {"red": pytest.approx(MID, abs=1e-5),
                                                 "green": pytest.approx(MID, abs=1e-5)}
    assert "thresholds: 0.5 for every tag (--threshold)" in result.stderr.splitlines()[0]
    # evaluate-project names the model first too, and uses the same default.
    result = run_cli("evaluate-project", project, images["yellow"], "--format", "json")
    assert json.loads(result.stdout)["tags"] == {"green": pytest.approx(MID, abs=1e-5)}
    assert result.stderr.startswith(f"Model: {project / 'model-resnet_small.keras'} (the project's final export)")


def test_a_bad_training_setting_does_not_stop_evaluate(project, images):
    config = json.loads((project / "project.json").read_text())
    (project / "project.json").write_text(json.dumps({**config, "learning_rate": 0, "minibatch_sise": 8}))
    result = run_cli("evaluate", images["red"], "--project-path", project)
    assert result.exit_code == 0, result.output
    assert "learning_rate: must be > 0.0, got 0 (not used by this command" in result.stderr
    assert "unknown key 'minibatch_sise' is ignored (did you mean 'minibatch_size'?)" in result.stderr
    config["model"] = "resnet_smal"
    (project / "project.json").write_text(json.dumps(config))
    result = run_cli("evaluate", images["red"], "--project-path", project)
    assert result.exit_code == 2 and "model: must be one of" in result.stderr
    # With --model-path the project's `model` names nothing used: a warning.
    result = run_cli("evaluate", images["red"], "--project-path", project, "--model-path",
                     project / "model-resnet_small.keras")
    assert result.exit_code == 0 and "model: must be one of" in result.stderr and "not used by this command" in \
        result.stderr


def test_a_missing_target_does_not_stop_the_others(project, images, tmp_path):
    gone = tmp_path / "gone.png"
    result = run_cli("evaluate", images["red"], gone, images["yellow"], tmp_path / "also_gone.jpg",
                     "--project-path", project, "--format", "json")
    assert result.exit_code == 1
    assert [json.loads(line)["path"] for line in result.stdout.splitlines()] == [str(images["red"]),
                                                                                 str(images["yellow"])]
    errors = result.stderr.splitlines()
    assert errors[0].startswith("Model: ")
    assert errors[1:] == [f"skipped {gone}: not found", f"skipped {tmp_path / 'also_gone.jpg'}: not found",
                          "2 of 4 images could not be read and were skipped"]


def test_json_and_csv_outputs(project, images):
    result = run_cli("evaluate", images["yellow"], images["red"], "--project-path", project, "--format", "json",
                     "--threshold", "0.001")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["path"] for r in records] == [str(images["red"]), str(images["yellow"])]  # natural order
    assert records[0]["tags"] == {"red": pytest.approx(HIGH, abs=1e-6)}
    assert records[1]["tags"] == {"red": pytest.approx(MID, abs=1e-5), "green": pytest.approx(MID, abs=1e-5)}
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--format", "csv")
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["path", "tag", "score"]
    assert [(r[0], r[1]) for r in rows[1:]] == [(str(images["yellow"]), "red"), (str(images["yellow"]), "green")]
    assert float(rows[1][2]) == pytest.approx(MID, abs=1e-5)


def test_folder_recursion_filters_natural_order_and_save_txt(project, tmp_path):
    folder = tmp_path / "shots"
    for name, rgb in [("img10.png", (0, 0, 255)), ("img2.png", (255, 0, 0)), ("sub/img1.png", (0, 255, 0)),
                      ("skip.bmp", (255, 0, 0))]:
        solid(folder / name, rgb)
    refused = run_cli("evaluate", folder, "--project-path", project)
    assert refused.exit_code == 2 and "is a folder; pass --allow-folder" in refused.output
    result = run_cli("evaluate", folder, "--project-path", project, "--allow-folder", "--folder-filters", "*.png",
                     "--save-txt", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["path"] for line in result.stdout.splitlines()] == [
        str(folder / "img2.png"), str(folder / "img10.png"), str(folder / "sub" / "img1.png")]
    assert (folder / "img2.txt").read_text() == "red"
    assert (folder / "img10.txt").read_text() == "blue"
    assert (folder / "sub" / "img1.txt").read_text() == "green"
    assert not (folder / "skip.txt").exists()


def test_a_file_name_that_is_not_utf8_is_tagged_with_the_others(project, tmp_path):
    folder = tmp_path / "shots"
    solid(folder / os.fsdecode(b"red\xff.png"), (255, 0, 0))
    solid(folder / "green.png", (0, 255, 0))
    result = run_cli("evaluate", folder, "--project-path", project, "--allow-folder", "--save-txt")
    assert result.exit_code == 0, result.output
    assert (folder / os.fsdecode(b"red\xff.txt")).read_text() == "red" and (folder / "green.txt").read_text() == "green"
    result = run_cli("grad-cam", project, folder, "--save-path", tmp_path / "maps")
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in (tmp_path / "maps").iterdir()) == ["green", "red_"]


def test_save_txt_joins_tags_with_commas(project, images):
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--save-txt")
    assert result.exit_code == 0, result.output
    assert images["yellow"].with_suffix(".txt").read_text() == "red, green"


@pytest.mark.parametrize("mode", [[], ["--append"], ["--overwrite"]])
def test_two_images_that_would_write_one_caption_are_refused_before_any_is_written(project, tmp_path, mode):
    folder = tmp_path / "shots"
    red, green = solid(folder / "a.png", (255, 0, 0)), solid(folder / "a.bmp", (0, 255, 0))
    result = run_cli("evaluate", folder, "--project-path", project, "--allow-folder", "--folder-filters",
                     "*.png,*.bmp", "--save-txt", *mode)
    assert result.exit_code == 2 and not (folder / "a.txt").exists()
    assert result.stderr == (f"error: {folder / 'a.txt'}: the caption of both {green} and {red} (a caption is named "
                             "after its image without the extension); rename one of them\n")
    # Given one relative, one absolute: still one file.
    result = run_cli("evaluate", os.path.relpath(red), green, "--project-path", project, "--save-txt", *mode)
    assert result.exit_code == 2 and "rename one of them" in result.stderr and not (folder / "a.txt").exists()


@pytest.mark.slow
def test_save_txt_never_replaces_a_caption_without_overwrite_or_append(project, images):
    hand_written = images["yellow"].with_suffix(".txt")
    hand_written.write_text("my cat, sunny day\n")
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project, "--save-txt")
    assert result.exit_code == 2
    assert result.stderr == (f"error: {hand_written}: already exists; --overwrite replaces caption files, "
                             "--append adds the new tags to them\n")
    assert hand_written.read_text() == "my cat, sunny day\n" and not images["red"].with_suffix(".txt").exists()

    # --append keeps the text and adds only the tags it does not hold, in whatever spelling it holds them.
    hand_written.write_text("my cat, Red\n")
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--save-txt", "--append")
    assert result.exit_code == 0, result.output
    assert hand_written.read_text() == "my cat, Red, green\n"
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--save-txt", "--append")
    assert hand_written.read_text() == "my cat, Red, green\n"

    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--save-txt", "--overwrite",
                     "--caption-extension", "caption")
    assert result.exit_code == 0 and images["yellow"].with_suffix(".caption").read_text() == "red, green"
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--save-txt", "--overwrite")
    assert result.exit_code == 0 and hand_written.read_text() == "red, green"
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--append")
    assert result.exit_code == 2 and result.stderr == "error: --append: only used with --save-txt\n"


def test_append_to_a_caption_that_is_not_utf8_changes_nothing(project, images):
    latin1 = images["yellow"].with_suffix(".txt")
    latin1.write_bytes("café, garçon".encode("latin-1"))
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project, "--save-txt", "--append")
    assert result.exit_code == 2
    assert result.stderr == (f"error: {latin1}: is not UTF-8 text (byte 0xe9 at offset 3); save it as UTF-8\n")
    assert latin1.read_bytes() == "café, garçon".encode("latin-1")
    assert not images["red"].with_suffix(".txt").exists()


def test_captions_written_by_save_txt_are_what_import_images_reads(project, images, tmp_path):
    """--append to a whitespace-separated caption, and one tag holding a space, read back tag for tag."""
    import sqlite3

    (project / "tags.txt").write_text("white_background\ngreen\nblue\n")  # red scores white_background
    spaced = images["yellow"].with_suffix(".txt")
    spaced.write_text("1girl long_hair green\n")
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project, "--save-txt",
                     "--append", "--remove-underscore")
    assert result.exit_code == 0, result.output
    assert spaced.read_text() == "1girl, long_hair, green, white background\n"
    assert images["red"].with_suffix(".txt").read_text() == "white background,"
    dataset = tmp_path / "dataset"
    result = run_cli("import-images", images["red"].parent, dataset)
    assert result.exit_code == 0, result.output
    with sqlite3.connect(dataset / "dataset.sqlite") as connection:
        posts = connection.execute("SELECT tag_string FROM posts ORDER BY id").fetchall()
    assert posts == [("white_background",), ("1girl long_hair green white_background",)]


def test_caption_separator_is_written_and_read_back_by_import_images_with_it(project, images, tmp_path):
    import sqlite3

    (project / "tags.txt").write_text("white_background\ngreen\nblue\n")  # red scores white_background
    piped = images["yellow"].with_suffix(".txt")
    piped.write_text("long hair|a, b\n")
    for refused, message in ((("--caption-separator", "x"), "--caption-separator: only used with --save-txt"),
                             (("--save-txt", "--caption-separator", ""), "--caption-separator: '' is empty")):
        result = run_cli("evaluate", images["red"], "--project-path", project, *refused)
        assert result.exit_code == 2 and result.stderr.startswith(f"error: {message}"), result.output
        assert len(result.stderr.splitlines()) == 1 and not images["red"].with_suffix(".txt").exists()
    result = run_cli("evaluate", images["red"], images["yellow"], "--project-path", project, "--save-txt",
                     "--append", "--remove-underscore", "--caption-separator", " | ")
    assert result.exit_code == 0, result.output
    assert piped.read_text() == "long hair | a, b | white background | green\n"
    assert images["red"].with_suffix(".txt").read_text() == "white background|"
    dataset = tmp_path / "dataset"
    result = run_cli("import-images", images["red"].parent, dataset, "--caption-separator", "|")
    assert result.exit_code == 0, result.output
    with sqlite3.connect(dataset / "dataset.sqlite") as connection:
        posts = connection.execute("SELECT tag_string FROM posts ORDER BY id").fetchall()
    assert posts == [("white_background",), ("long_hair a,_b white_background green",)]


def test_category_thresholds_undesired_tags_order_and_underscores(project, tmp_path):
    teal = solid(tmp_path / "teal.png", (0, 153, 255))  # green 0.881, blue 0.99995
    (project / "tags.txt").write_text("red\nlong_hair\nblue_eyes\n")
    result = run_cli("evaluate", teal, "--project-path", project, "--character-threshold", "0.9")
    assert result.exit_code == 2
    assert result.stderr == (f"error: --character-threshold: no tag of the model is known as a character tag"
                             f": {project / 'categories.json'} is missing (download-tags writes it)\n")
    (project / "categories.json").write_text(json.dumps([{"name": "General", "start_index": 0},
                                                         {"name": "Character", "start_index": 2}]))
    result = run_cli("evaluate", teal, "--project-path", project, "--general-threshold", "0.95",
                     "--character-threshold", "0.5", "--format", "json")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["tags"]) == ["blue_eyes"]  # long_hair 0.881 < 0.95
    assert "thresholds: 0.5 for every tag; general tags: 0.95; character tags: 0.5" in result.stderr
    result = run_cli("evaluate", teal, "--project-path", project, "--order-by-score", "--save-txt",
                     "--remove-underscore")
    assert result.exit_code == 0, result.output
    assert teal.with_suffix(".txt").read_text() == "blue eyes, long hair"
    result = run_cli("evaluate", teal, "--project-path", project, "--undesired-tags", "blue eyes, cat",
                     "--format", "json")
    assert list(json.loads(result.stdout)["tags"]) == ["long_hair"]
    assert "note: --undesired-tags: 'cat' is not one of the model's tags" in result.stderr


def test_thresholds_csv(project, images, tmp_path):
    thresholds = write_thresholds(tmp_path / "model.thresholds.csv", [("red", 0.95), ("green", 0.5)])
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--thresholds-csv", thresholds,
                     "--format", "json", "--threshold", "0.00001")
    assert result.exit_code == 0, result.output
    # red 0.881 < 0.95 drops out; green keeps 0.5; blue (not in the CSV) uses --threshold.
    assert json.loads(result.stdout)["tags"] == {"green": pytest.approx(MID, abs=1e-5),
                                                 "blue": pytest.approx(LOW, abs=1e-6)}
    foreign = write_thresholds(tmp_path / "other.thresholds.csv", [("cat", 0.5)])
    result = run_cli("evaluate", images["yellow"], "--project-path", project, "--thresholds-csv", foreign)
    assert result.exit_code == 2 and "'cat' is not in the model's tags.txt" in result.stderr


def test_corrupt_image_is_reported_and_skipped_with_exit_code_1(project, images, tmp_path):
    truncated = tmp_path / "images" / "broken.png"
    truncated.write_bytes(images["red"].read_bytes()[:60])
    not_image = tmp_path / "images" / "notes.jpg"
    not_image.write_text("hello")
    result = run_cli("evaluate", tmp_path / "images", "--project-path", project, "--allow-folder", "--format", "json")
    assert result.exit_code == 1
    tagged = [json.loads(line)["path"] for line in result.stdout.splitlines()]
    assert tagged == [str(images["green"]), str(images["red"]), str(images["yellow"])]
    errors = result.stderr.splitlines()[1:]  # after the Model: line
    assert errors[0].startswith(f"skipped {truncated}: ")
    assert errors[1] == f"skipped {not_image}: not an image (unrecognised file signature)"
    assert errors[2] == "2 of 5 images could not be read and were skipped"


def test_model_path_alone_uses_the_tags_recorded_inside(images, colour_model_file, tmp_path):
    from deepdanbooru.models.vocabulary import write_model_tags

    recorded = tmp_path / "recorded.keras"
    recorded.write_bytes(colour_model_file.read_bytes())
    write_model_tags(recorded, ["crimson", "lime", "navy"])
    result = run_cli("evaluate", images["red"], "--model-path", recorded)
    assert result.exit_code == 0, result.output
    assert "(1.000) crimson" in result.stdout and "red" not in result.stdout.replace(str(images["red"]), "")


@pytest.mark.parametrize("tags, difference", [
    (["green", "red", "blue"], "line 1 is 'green', the model's tag 1 'red'; the same tags in another order"),
    (["red", "lime", "blue"], "line 2 is 'lime', the model's tag 2 'green'"),
    (["red", "green"], "2 tags, the model's 3"),
])
def test_a_tags_file_other_than_the_one_the_model_records_is_refused(project, images, tags, difference):
    """Its scores would be printed, written and measured under other tags' names."""
    from deepdanbooru.models.vocabulary import write_model_tags

    export = project / "model-resnet_small.keras"
    write_model_tags(export, TAGS)
    (project / "tags.txt").write_text("".join(f"{tag}\n" for tag in tags))
    expected = (f"error: {project / 'tags.txt'}: not the tags {export} was trained with ({difference}); restore the "
                f"tags.txt it was trained with or train again (`deepdanbooru evaluate --model-path {export}` "
                "without --tags-path uses the tags it records)\n")
    for args in (["evaluate", images["red"], "--project-path", project], ["evaluate-project", project, images["red"]],
                 ["grad-cam", project, images["red"], "--save-path", project / "maps"]):
        result = run_cli(*args)
        assert (result.exit_code, result.stderr.splitlines()[-1] + "\n") == (2, expected), args
    assert not (project / "maps").exists()
    # Given with --tags-path, a file of as many tags is the user's naming of the outputs: a warning.
    result = run_cli("evaluate", images["red"], "--model-path", export, "--tags-path", project / "tags.txt")
    if len(tags) == len(TAGS):
        assert result.exit_code == 0 and f"warning: {project / 'tags.txt'}: not the tags {export} was trained " \
            f"with ({difference}); its scores are named by this file, line by line" in result.stderr
        assert f"(1.000) {tags[0]}" in result.stdout  # the red output, named by the file's first line
    else:
        assert result.exit_code == 2 and f"not the tags {export} was trained with" in result.stderr
    result = run_cli("evaluate", images["red"], "--model-path", export)  # the tags it records
    assert result.exit_code == 0 and "(1.000) red" in result.stdout


def test_model_from_files_and_source_errors(project, images, colour_model_file, tmp_path):
    tags = project / "tags.txt"
    result = run_cli("evaluate", images["red"], "--model-path", colour_model_file, "--tags-path", tags)
    assert result.exit_code == 0 and "(1.000) red" in result.stdout
    result = run_cli("evaluate", images["red"], "--model-path", colour_model_file)
    assert result.exit_code == 2
    assert result.stderr == ("error: --model-path needs --tags-path (the tags.txt the model was trained with); "
                             f"{colour_model_file} records no tags and has no .tags.txt beside it\n")
    result = run_cli("evaluate", images["red"])
    assert result.exit_code == 2 and "give --project-path, or --model-path with --tags-path" in result.stderr
    two_tags = tmp_path / "two.txt"
    two_tags.write_text("red\ngreen\n")
    result = run_cli("evaluate", images["red"], "--model-path", colour_model_file, "--tags-path", two_tags)
    assert result.exit_code == 2 and f"{two_tags} lists 2 tags" in result.stderr
    result = run_cli("evaluate", tmp_path / "nope.png", "--project-path", project)
    assert result.exit_code == 2 and "nope.png: not found" in result.stderr


def test_missing_export_is_a_clear_error_and_legacy_h5_is_used(project, images):
    export = project / "model-resnet_small.keras"
    model_bytes = export.read_bytes()
    export.unlink()
    result = run_cli("evaluate", images["red"], "--project-path", project)
    assert result.exit_code == 2
    assert "no exported model (looked for model-resnet_small.keras, model-resnet_small.float32.keras, " \
           "model-resnet_small.stopped.keras, model-resnet_small.h5)" in result.stderr
    (project / "model-resnet_small.e3.keras").write_bytes(model_bytes)
    result = run_cli("evaluate", images["red"], "--project-path", project)
    assert "use it with --model-path" in result.stderr and "model-resnet_small.e3.keras" in result.stderr
    # What a --time-limit stop wrote is used, and called what it is.
    stopped = project / "model-resnet_small.stopped.keras"
    stopped.write_bytes(model_bytes)
    result = run_cli("evaluate", images["red"], "--project-path", project, "--verbose")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"Model: {stopped} (the export of a --time-limit stop: training is not "
                                    "complete)")
    stopped.unlink()
    colour_model().save(project / "model-resnet_small.h5")
    result = run_cli("evaluate", images["red"], "--project-path", project, "--verbose")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"Model: {project / 'model-resnet_small.h5'} (the project's DeepDanbooru .h5 "
                                    "export)")
    assert "Input 32x32, 3 tags" in result.stderr
    assert "CPU:0" in result.stderr.split("Devices: ")[1].splitlines()[0]
    assert "(1.000) red" in result.stdout


def test_evaluate_project_shares_the_code(project, images):
    expected = run_cli("evaluate", images["yellow"].parent, "--project-path", project, "--allow-folder").stdout
    result = run_cli("evaluate-project", project, images["yellow"].parent)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected and "Tags of" in expected
    single = run_cli("evaluate-project", project, images["red"], "--threshold", "0.99")
    assert single.stdout == f"Tags of {images['red']}:\n({HIGH:05.3f}) red\n\n"


@pytest.mark.slow
def test_batches_match_one_image_at_a_time(tmp_path):
    """Batched, traced prediction equals calling the model on each preprocessed image alone."""
    tf = pytest.importorskip("tensorflow")
    from deepdanbooru.models.builder import build_model
    from deepdanbooru.pipeline import preprocess_for_inference

    model = build_model("resnet_small", (32, 32, 3), 3, seed=4)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.path.endswith("gamma"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
    model_path = tmp_path / "m.keras"
    model.save(model_path)
    tags = tmp_path / "tags.txt"
    tags.write_text("\n".join(TAGS))
    paths = []
    for index in range(5):
        path = tmp_path / f"p{index}.png"
        Image.fromarray(rng.integers(0, 256, (20 + 7 * index, 33, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    outputs = {}
    for batch_size in ("1", "2", "8"):
        result = run_cli("evaluate", *paths, "--model-path", model_path, "--tags-path", tags, "--threshold", "0",
                         "--format", "json", "--batch-size", batch_size)
        assert result.exit_code == 0, result.output
        outputs[batch_size] = [json.loads(line) for line in result.stdout.splitlines()]
    assert outputs["1"] == outputs["2"] == outputs["8"]
    for path, record in zip(paths, outputs["2"]):
        image = preprocess_for_inference(tf.io.read_file(str(path)), height=32, width=32, max_image_pixels=10**8)
        expected = model(image[None], training=False).numpy()[0]
        assert list(record["tags"]) == TAGS
        np.testing.assert_allclose(list(record["tags"].values()), expected, atol=2e-6)


@pytest.mark.slow
def test_round_trip_import_make_tags_train_evaluate(tmp_path):
    """Own pictures with .txt tags -> dataset -> tags.txt -> a tiny trained model -> evaluate --save-txt."""
    rng = np.random.default_rng(7)
    source = tmp_path / "pictures"
    source.mkdir()
    for index in range(16):
        colour = "red" if index % 2 else "blue"
        pixels = np.zeros((40, 40, 3), dtype=np.uint8)
        pixels[..., 0 if colour == "red" else 2] = 200
        pixels += rng.integers(0, 40, pixels.shape, dtype=np.uint8)
        Image.fromarray(pixels).save(source / f"pic{index}.png")
        (source / f"pic{index}.txt").write_text(f"{colour}, plain background")
    dataset = tmp_path / "dataset"
    assert run_cli("import-images", source, dataset).exit_code == 0
    project = tmp_path / "project"
    assert run_cli("create-project", project).exit_code == 0
    config = json.loads((project / "project.json").read_text())
    config.update({"database_path": str(dataset / "dataset.sqlite"), "minimum_tag_count": 0,
                   "model": "resnet_small", "image_width": 32, "image_height": 32, "minibatch_size": 8,
                   "epoch_count": 2, "validation_fraction": 0.0})
    (project / "project.json").write_text(json.dumps(config))
    made = run_cli("make-tags", project)
    assert made.exit_code == 0, made.output
    tags = (project / "tags.txt").read_text().split()
    assert sorted(tags) == ["blue", "plain_background", "red"]
    trained = run_cli("train-project", project)
    assert trained.exit_code == 0, trained.output
    assert (project / "model-resnet_small.keras").is_file()

    targets = tmp_path / "to_tag"
    targets.mkdir()
    for index in (0, 1, 10):
        (targets / f"pic{index}.png").write_bytes((source / f"pic{index}.png").read_bytes())
    result = run_cli("evaluate", targets, "--project-path", project, "--allow-folder", "--format", "json",
                     "--threshold", "0", "--save-txt")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(r["path"]).name for r in records] == ["pic0.png", "pic1.png", "pic10.png"]
    for record in records:
        assert list(record["tags"]) == tags
        assert all(0.0 <= score <= 1.0 for score in record["tags"].values())
        assert Path(record["path"]).with_suffix(".txt").read_text() == ", ".join(tags)


def test_inference_devices_skip_grappler_without_a_gpu():
    import tensorflow as tf

    from deepdanbooru.inference.predict import configure_devices

    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
    try:
        devices = configure_devices(allow_gpu=False)
        assert not any(name.startswith("GPU") for name in devices)
        assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is True
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})
