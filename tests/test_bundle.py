"""export-bundle: the bundle read and run as each WD-tagger tool reads and runs it.

kohya's tag_images_by_wd14_tagger reads the scores by position (0-3 ratings, 4 + i the i-th general row of
selected_tags.csv, then the characters) and always feeds 448 x 448; the WebUI tagger takes the first four CSV
rows as ratings and wants one .csv and one .onnx in the folder; SmilingWolf's wd-tagger space selects rows by
category. Every tool composites alpha onto white and pads to a white square. The pictures here are non-square,
with transparency, fed as a batch of several; the expected scores come from the Keras model on pictures
prepared independently of the code under test.
"""

import csv
import json

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.inference.bundle_rows import WD_RATINGS, plan_rows

tf = pytest.importorskip("tensorflow")

ONNX_MISSING = "export-bundle needs the optional packages tf2onnx and onnxruntime (pip install '.[test]')"
try:
    import onnxruntime
    import tf2onnx  # noqa: F401
except ImportError:  # CI installs them with the test extra; a bare install skips with this reason.
    onnxruntime = None

needs_onnx = pytest.mark.skipif(onnxruntime is None, reason=ONNX_MISSING)

GENERAL, CHARACTER = 11, 3  # sample tags 0-10 general, 11-13 character, 14-16 copyright
RATINGS = ["rating:safe", "rating:questionable", "rating:explicit"]  # DeepDanbooru's three
SIZE = 32  # the model's input; the bundle's is 448


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def tiny_model(n_tags, seed=0):
    """Small enough to convert in a second; its scores depend on colour and position."""
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 5, strides=2, activation="tanh")(inputs)
    x = keras.layers.Conv2D(8, 3, strides=2, activation="tanh")(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(n_tags, activation="sigmoid")(x)
    return keras.Model(inputs, outputs)


def make_project(root, sample_dataset, tags, categories=None):
    database, _ = sample_dataset
    project = root / "project"
    project.mkdir(parents=True)
    config = {"image_width": SIZE, "image_height": SIZE, "database_path": str(database), "minimum_tag_count": 1,
              "model": "resnet_small", "validation_fraction": 0.25}
    (project / "project.json").write_text(json.dumps(config))
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    if categories:
        (project / "categories.json").write_text(json.dumps(categories))
    tiny_model(len(tags)).save(project / "model-resnet_small.keras")
    return project


def alpha_pictures(directory):
    """Non-square pictures with transparency (fully transparent pixels black underneath), 2:3, 3:2 and a palette."""
    from PIL import Image

    rng = np.random.default_rng(3)
    paths = []
    for index, (width, height) in enumerate([(40, 60), (90, 60), (33, 50), (64, 48), (50, 50), (120, 80)]):
        pixels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        pixels[..., 3] = np.where(rng.random((height, width)) < 0.4, 0, pixels[..., 3])
        pixels[pixels[..., 3] == 0, :3] = 0
        picture = Image.fromarray(pixels, "RGBA")
        if index == 2:
            picture = picture.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE)
            picture.info["transparency"] = 0
        paths.append(directory / f"picture{index}.png")
        picture.save(paths[-1])
    return paths


def tool_feed(path, size=448):
    """What kohya's tagger feeds: alpha on white, centred white square, area resize, BGR float32 0-255."""
    from PIL import Image

    with Image.open(path) as opened:
        rgba = opened.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    white.alpha_composite(rgba)
    picture = white.convert("RGB")
    side = max(picture.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(picture, ((side - picture.width) // 2, (side - picture.height) // 2))
    square = square.resize((size, size), Image.Resampling.BOX if side > size else Image.Resampling.LANCZOS)
    return np.asarray(square, dtype=np.float32)[:, :, ::-1]


def keras_scores(model, batch):
    """The model on tool-fed pictures: RGB / 255, shrunk 448 -> 32 by 14 x 14 block means (area)."""
    rgb = batch[..., ::-1] / 255.0
    factor = rgb.shape[1] // SIZE
    small = rgb.reshape(len(rgb), SIZE, factor, SIZE, factor, 3).mean(axis=(2, 4))
    return np.asarray(model(small.astype(np.float32), training=False))


def read_csv_as_kohya(path):
    """kohya: header check, then rows; ratings are the category-9 rows, general 0, character 4, in CSV order."""
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.reader(stream))
    header, rows = rows[0], rows[1:]
    assert header[:3] == ["tag_id", "name", "category"]
    ratings = [row[1] for row in rows if row[2] == "9"]
    general = [row[1] for row in rows if row[2] == "0"]
    character = [row[1] for row in rows if row[2] == "4"]
    return ratings, general, character


def kohya_caption(probs, general, character, general_threshold, character_threshold):
    """kohya's positional read of one picture's scores (IndexError if a row is unaccounted for)."""
    found = []
    for index, score in enumerate(probs[4:]):
        if index < len(general) and score >= general_threshold:
            found.append(general[index])
        elif index >= len(general) and score >= character_threshold:
            found.append(character[index - len(general)])
    return found


def run_bundle(bundle, batch):
    session = onnxruntime.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    model_input = session.get_inputs()[0]
    return session.run(None, {model_input.name: batch})[0], session


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, sample_dataset):
    """Three DeepDanbooru ratings (listed last), general, character and copyright tags; bundled once at 448."""
    _, sample_tags = sample_dataset
    root = tmp_path_factory.mktemp("bundle")
    tags = [*sample_tags, *RATINGS]
    project = make_project(root, sample_dataset, tags, [
        {"name": "General", "start_index": 0}, {"name": "Character", "start_index": GENERAL},
        {"name": "Copyright", "start_index": GENERAL + CHARACTER}, {"name": "System", "start_index": len(sample_tags)}])
    if onnxruntime is None:
        return project, tags, None, None
    bundle = root / "bundle"
    result = run_cli("export-bundle", project, bundle, "--split", "all")
    assert result.exit_code == 0, result.output
    return project, tags, bundle, result


@needs_onnx
def test_kohya_reads_the_rows_by_position_from_a_448_batch_of_alpha_pictures(bundled, tmp_path):
    from deepdanbooru.models.files import load_model_file

    project, tags, bundle, _ = bundled
    ratings, general, character = read_csv_as_kohya(bundle / "selected_tags.csv")
    assert ratings == list(WD_RATINGS)
    assert general == tags[:GENERAL] and character == tags[GENERAL:GENERAL + CHARACTER]  # copyright left out
    batch = np.stack([tool_feed(path) for path in alpha_pictures(tmp_path)])
    probs, session = run_bundle(bundle, batch)
    assert len(session.get_inputs()) == 1  # kohya reads graph.input[0]; a symbolic batch keeps its --batch_size
    model_input = session.get_inputs()[0]
    assert isinstance(model_input.shape[0], str) and model_input.shape[1:] == [448, 448, 3]
    assert session.get_outputs()[0].name == "predictions_sigmoid"
    assert probs.shape == (len(batch), 4 + GENERAL + CHARACTER)

    expected = keras_scores(load_model_file(project / "model-resnet_small.keras"), batch)
    index = {tag: position for position, tag in enumerate(tags)}
    ratings_expected = np.stack([expected[:, index["rating:safe"]], np.zeros(len(batch)),
                                 expected[:, index["rating:questionable"]], expected[:, index["rating:explicit"]]], 1)
    np.testing.assert_allclose(probs[:, :4], ratings_expected, atol=1e-4)
    assert np.all(probs[:, 1] == 0.0)  # sensitive: the project has no such tag
    for position, tag in enumerate(general + character):
        np.testing.assert_allclose(probs[:, 4 + position], expected[:, index[tag]], atol=1e-4)
    assert np.ptp(probs[:, 4:], axis=0).max() > 1e-3  # the scores depend on the picture: agreement means something
    for scores, wanted in zip(probs, expected):
        by_name = [tag for tag in general + character if wanted[index[tag]] >= 0.5]
        assert kohya_caption(scores, general, character, 0.5, 0.5) == by_name


@needs_onnx
def test_webui_and_wd_tagger_space_see_the_same_rows(bundled):
    _, tags, bundle, _ = bundled
    files = sorted(path.name for path in bundle.iterdir())
    assert files == ["metrics.json", "model.onnx", "preprocess.json", "selected_tags.csv"]
    assert [name for name in files if name.endswith((".csv", ".onnx"))] == ["model.onnx", "selected_tags.csv"]
    with open(bundle / "selected_tags.csv", newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    names = [row["name"] for row in rows]
    categories = np.array([int(row["category"]) for row in rows])
    # WebUI: the first four rows are the ratings, the rest tags.
    assert names[:4] == list(WD_RATINGS) and names[4:] == tags[:GENERAL + CHARACTER]
    # wd-tagger space: rows by category; their positions are the score positions.
    assert list(np.where(categories == 9)[0]) == [0, 1, 2, 3]
    assert list(np.where(categories == 0)[0]) == list(range(4, 4 + GENERAL))
    assert list(np.where(categories == 4)[0]) == list(range(4 + GENERAL, 4 + GENERAL + CHARACTER))
    # The thresholds ride along as a column; the constant sensitive row has none.
    assert [row["best_threshold"] == "" for row in rows] == [False, True, False, False] + [False] * (len(rows) - 4)


@needs_onnx
def test_thresholds_and_metrics_are_those_of_tool_fed_pictures(bundled, sample_dataset):
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.scoring.metrics import ValidationMetrics

    _, tags, bundle, result = bundled
    database, _ = sample_dataset
    records = load_records(database, 1, ("jpg",))
    probs, _ = run_bundle(bundle, np.stack([tool_feed(path) for path in records.paths()]))
    measured = [0, 2, 3, *range(4, 4 + GENERAL + CHARACTER)]  # all but the constant sensitive row
    names = ["rating:safe", "rating:questionable", "rating:explicit", *tags[:GENERAL + CHARACTER]]
    labels = np.array([[tag in text.split() for tag in names] for text in records.tag_strings], np.float32)
    metrics = ValidationMetrics(len(measured), categories={"general": list(range(3, 3 + GENERAL)),
                                                           "character": list(range(3 + GENERAL, len(measured)))})
    metrics.update(probs[:, measured], labels)
    ours = metrics.result()

    saved = json.loads((bundle / "metrics.json").read_text())
    figures = saved["metrics"]
    assert saved["records"] == len(records) and saved["rows"] == ["general", "questionable", "explicit",
                                                                   *tags[:GENERAL + CHARACTER]]
    assert saved["constant_rows"] == ["sensitive"] and "white square" in saved["measured_as"]
    for key in ("map", "pr_f1", "macro_f1_040", "general_pr_f1", "character_pr_f1"):
        assert figures[key] == pytest.approx(ours[key], abs=1e-3), key
    assert saved["category_thresholds"] == {"general": figures["general_pr_threshold"],
                                            "character": figures["character_pr_threshold"]}
    with open(bundle / "selected_tags.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    # No *.thresholds.csv beside this model: the per-tag thresholds are derived from the tool-fed measurement by
    # the rule training uses (a withheld tag's is inf: never emitted), and metrics.json says so.
    thresholds = [float(rows[position]["best_threshold"]) for position in measured]
    per_tag = ours["per_tag"]
    expected = np.where(per_tag["withheld"], np.inf, per_tag["threshold"])
    assert thresholds == pytest.approx(list(expected), abs=0.011)
    assert [rows[position]["use"] for position in measured] == [
        "withheld" if withheld else "own" if own else "fallback"
        for withheld, own in zip(per_tag["withheld"], per_tag["calibrated"])]
    assert saved["tag_thresholds"].startswith("derived from this measurement")

    preprocess = json.loads((bundle / "preprocess.json").read_text())
    assert (preprocess["height"], preprocess["width"], preprocess["model_input_size"]) == (448, 448, [SIZE, SIZE])
    assert (preprocess["channel_order"], preprocess["value_range"]) == ("BGR", [0, 255])
    assert preprocess["ratings"] == {"general": "rating:safe", "sensitive": None,
                                     "questionable": "rating:questionable", "explicit": "rating:explicit"}
    assert preprocess["dropped"] == {"copyright": 3}
    assert "Left out (the tools read by position): 3 copyright (large, small, multicolored)" in result.output
    assert "sensitive <- constant 0" in result.output


@needs_onnx
def test_a_project_without_ratings_gets_four_zero_rows_at_its_own_size(sample_dataset, tmp_path):
    _, tags = sample_dataset
    project = make_project(tmp_path, sample_dataset, tags)
    bundle = tmp_path / "bundle"
    result = run_cli("export-bundle", project, bundle, "--split", "all", "--size", SIZE)
    assert result.exit_code == 0, result.output
    ratings, general, character = read_csv_as_kohya(bundle / "selected_tags.csv")
    assert ratings == list(WD_RATINGS) and general == tags and character == []
    probs, session = run_bundle(bundle, np.stack([tool_feed(path, SIZE) for path in alpha_pictures(tmp_path)]))
    assert session.get_inputs()[0].shape[1:] == [SIZE, SIZE, 3]
    assert np.all(probs[:, :4] == 0.0) and probs.shape[1] == 4 + len(tags)
    assert json.loads((bundle / "preprocess.json").read_text())["in_graph"][2] == "resize: none"


@needs_onnx
def test_the_bundle_carries_the_thresholds_evaluate_uses(sample_dataset, tmp_path):
    from deepdanbooru.scoring.thresholds import read_thresholds_csv

    _, tags = sample_dataset
    project = make_project(tmp_path, sample_dataset, tags)
    beside = project / "model-resnet_small.thresholds.csv"
    uses = ["own", "fallback", "withheld"]
    beside.write_text("tag,threshold,precision,recall,f1,support,ap,use,reason\n" + "".join(
        f"{tag},{0.3 + 0.01 * index},0.5,0.5,0.{index + 1},9,0.5,{uses[index % 3]},why\n"
        for index, tag in enumerate(tags)))
    bundle = tmp_path / "bundle"
    result = run_cli("export-bundle", project, bundle, "--split", "all", "--size", SIZE)
    assert result.exit_code == 0, result.output
    with open(bundle / "selected_tags.csv", newline="") as stream:
        rows = {row["name"]: row for row in csv.DictReader(stream)}
    evaluate = read_thresholds_csv(beside)
    assert {tag: float(rows[tag]["best_threshold"]) for tag in tags} == evaluate
    assert rows[tags[2]]["best_threshold"] == "inf" and rows[tags[2]]["use"] == "withheld"
    assert rows[tags[0]]["best_f1"] == "0.100000"
    assert json.loads((bundle / "metrics.json").read_text())["tag_thresholds"] == str(beside)
    assert f"Per-tag thresholds in selected_tags.csv (best_threshold, use): {beside}, as evaluate uses them" in \
        result.output


@needs_onnx
def test_bad_destinations_and_models_get_one_line_and_nothing_written(bundled, tmp_path):
    project, tags, bundle, _ = bundled
    before = {path.name: path.stat().st_mtime_ns for path in bundle.iterdir()}
    again = run_cli("export-bundle", project, bundle, "--split", "all")
    assert again.exit_code == 2 and "already exists and holds metrics.json; use --overwrite" in again.output
    assert {path.name: path.stat().st_mtime_ns for path in bundle.iterdir()} == before

    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / "other_tags.csv").write_text("x\n")
    refused = run_cli("export-bundle", project, crowded, "--split", "all", "--overwrite")
    assert refused.exit_code == 2 and "other_tags.csv: is not a bundle file" in refused.output
    assert [path.name for path in crowded.iterdir()] == ["other_tags.csv"]

    wrong = tmp_path / "wrong.keras"
    tiny_model(len(tags) - 1).save(wrong)
    out = tmp_path / "out"
    refused = run_cli("export-bundle", project, out, "--model-path", wrong, "--split", "all")
    assert refused.exit_code != 0 and len(refused.output.strip().splitlines()) == 1
    assert f"but {project / 'tags.txt'} lists {len(tags)} tags" in refused.output
    assert not out.exists()


def test_without_onnx_packages_the_command_says_how_to_install(bundled, tmp_path, monkeypatch):
    from deepdanbooru.inference import onnx_graph

    monkeypatch.setattr(onnx_graph, "onnx_available", lambda: False)
    result = run_cli("export-bundle", bundled[0], tmp_path / "out")
    assert result.exit_code == 2
    assert "export-bundle needs the optional packages tf2onnx and onnxruntime" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tags, categories, ratings, dropped", [
    # WD's four, listed in another order: each goes to its row.
    (["rating:explicit", "a", "rating:general", "rating:questionable", "rating:sensitive"], [9, 0, 9, 9, 9],
     ["rating:general", "rating:sensitive", "rating:questionable", "rating:explicit"], {}),
    # DeepDanbooru's three: safe means general; nothing feeds sensitive.
    (["a", "rating:safe", "rating:questionable", "rating:explicit"], [0, 9, 9, 9],
     ["rating:safe", None, "rating:questionable", "rating:explicit"], {}),
    # None: four constant rows.
    (["a", "b"], [None, None], [None, None, None, None], {}),
    # The exact name wins over safe; an unknown rating and the extra categories are left out.
    (["rating:safe", "a", "rating:general", "rating:x", "artist_a", "series", "meta", "miku"], [9, 0, 9, 9, 1, 3, 5, 4],
     ["rating:general", None, None, None],
     {"rating": ["rating:safe", "rating:x"], "artist": ["artist_a"], "copyright": ["series"], "meta": ["meta"]}),
])
def test_rows_are_four_wd_ratings_then_general_then_character(tags, categories, ratings, dropped):
    plan = plan_rows(tags, categories)
    assert [row.name for row in plan.rows[:4]] == list(WD_RATINGS)
    assert [None if row.source is None else tags[row.source] for row in plan.rows[:4]] == ratings
    general = [tag for tag, value in zip(tags, categories) if value in (0, None)]
    character = [tag for tag, value in zip(tags, categories) if value == 4]
    assert [row.name for row in plan.rows[4:]] == general + character
    assert [row.category for row in plan.rows] == [9] * 4 + [0] * len(general) + [4] * len(character)
    assert plan.dropped == dropped


def test_the_in_graph_resize_averages_areas():
    from deepdanbooru.inference.bundle import area_matrix, area_resize

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (2, 448, 448, 3)).astype(np.float32)
    blocks = images.reshape(2, 32, 14, 32, 14, 3).mean(axis=(2, 4))
    np.testing.assert_allclose(area_resize(images, 32, 32), blocks, rtol=1e-5)
    for source, target in ((448, 299), (448, 512), (7, 3)):
        matrix = area_matrix(source, target)
        np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=1e-5)  # a weighted mean per output pixel
        np.testing.assert_allclose(matrix.sum(axis=0), target / source, rtol=1e-5)  # every input pixel counts equally


def test_tool_feed_composites_alpha_onto_white(tmp_path):
    from PIL import Image

    from deepdanbooru.inference.toolfeed import tool_picture

    pixels = np.zeros((20, 10, 4), np.uint8)  # black, fully transparent, on the left half opaque red
    pixels[:, :5] = (255, 0, 0, 255)
    Image.fromarray(pixels, "RGBA").save(tmp_path / "a.png")
    picture = tool_picture(tmp_path / "a.png", 20)
    assert picture.shape == (20, 20, 3)
    np.testing.assert_array_equal(picture[10, 0], [255, 255, 255])  # white padding
    np.testing.assert_array_equal(picture[10, 6], [0, 0, 255])  # red, as BGR
    np.testing.assert_array_equal(picture[10, 12], [255, 255, 255])  # transparent -> white, not black
