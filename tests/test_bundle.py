"""export-bundle: the WD-style bundle, used as today's tagger tools use it, answers as evaluate does."""

import csv
import json
import os
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main

tf = pytest.importorskip("tensorflow")

ONNX_MISSING = "export-bundle needs the optional packages tf2onnx and onnxruntime (pip install '.[test]')"
try:
    import onnxruntime
    import tf2onnx  # noqa: F401
except ImportError:  # CI installs them with the test extra; a bare install skips with this reason.
    onnxruntime = None

needs_onnx = pytest.mark.skipif(onnxruntime is None, reason=ONNX_MISSING)

CHARACTER_START = 11  # sample tags 11.. stand in for character tags
RATING = "rating:general"


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def bundled(tmp_path_factory, sample_dataset):
    """A project with categories.json and an export whose outputs depend on the input, bundled once."""
    from deepdanbooru.models.builder import build_model

    database, tags = sample_dataset
    project = tmp_path_factory.mktemp("bundle") / "project"
    project.mkdir()
    all_tags = [*tags, RATING]
    config = {"image_width": 32, "image_height": 32, "database_path": str(database), "minimum_tag_count": 1,
              "model": "resnet_small", "validation_fraction": 0.25}
    (project / "project.json").write_text(json.dumps(config))
    (project / "tags.txt").write_text("\n".join(all_tags) + "\n")
    (project / "categories.json").write_text(json.dumps([
        {"name": "General", "start_index": 0}, {"name": "Character", "start_index": CHARACTER_START},
        {"name": "System", "start_index": len(tags)}]))
    model = build_model("resnet_small", (32, 32, 3), len(all_tags), seed=1)
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.path.endswith("gamma"):
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
    model.save(project / "model-resnet_small.keras")
    if onnxruntime is None:
        return project, None, None
    bundle = project.parent / "bundle"
    result = run_cli("export-bundle", project, bundle, "--split", "all")
    return project, bundle, result


@pytest.mark.slow
@needs_onnx
def test_bundle_files_and_tag_table(bundled, sample_dataset):
    import sqlite3

    project, bundle, result = bundled
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in bundle.iterdir()) == ["metrics.json", "model.onnx", "preprocess.json",
                                                        "selected_tags.csv", "thresholds.csv"]
    umask = os.umask(0)
    os.umask(umask)
    assert {p.stat().st_mode & 0o777 for p in bundle.iterdir()} == {0o666 & ~umask}  # shareable, as open() makes
    database, tags = sample_dataset
    with open(bundle / "selected_tags.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["tag_id", "name", "category", "count"]
    # Ratings first (9), then general (0), then character (4), each in tags.txt order.
    assert [row["name"] for row in rows] == [RATING, *tags[:CHARACTER_START], *tags[CHARACTER_START:]]
    assert [row["category"] for row in rows] == ["9"] + ["0"] * CHARACTER_START + ["4"] * (len(tags) - CHARACTER_START)
    strings = [text for (text,) in sqlite3.connect(database).execute("SELECT tag_string FROM posts")]
    expected = Counter(tag for text in strings for tag in text.split())
    assert {row["name"]: int(row["count"]) for row in rows} == {tag: expected[tag] for tag in [*tags, RATING]}
    assert int(rows[1]["tag_id"]) == 0 and int(rows[0]["tag_id"]) == len(tags)

    with open(bundle / "thresholds.csv", newline="") as stream:
        assert [row["tag"] for row in csv.DictReader(stream)] == [row["name"] for row in rows]
    metrics = json.loads((bundle / "metrics.json").read_text())
    figures = metrics["metrics"]
    assert metrics["split"] == "all" and metrics["records"] == 24
    assert metrics["category_thresholds"] == {"general": figures["general_pr_threshold"],
                                              "character": figures["character_pr_threshold"]}
    for key in ("pr_threshold", "pr_f1", "macro_f1_040", "macro_mcc_040", "character_macro_f1_040"):
        assert isinstance(figures[key], float), key
    preprocess = json.loads((bundle / "preprocess.json").read_text())
    assert (preprocess["height"], preprocess["width"], preprocess["channel_order"]) == (32, 32, "BGR")
    assert preprocess["value_range"] == [0, 255]
    assert "Thresholds (P=R on the all split): general" in result.output
    # The same figures as evaluate-project --metrics on the same records.
    measured = run_cli("evaluate-project", project, "--metrics", "--split", "all", "--format", "json")
    assert json.loads(measured.output)["metrics"] == figures


def tool_preprocess(path, size):
    """What the WD tagger tools do with an image: RGB, white-padded square, area resize, BGR float 0-255."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    side = max(image.size)
    square = Image.new("RGB", (side, side), (255, 255, 255))
    square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    square = square.resize((size, size), Image.BOX)
    return np.asarray(square, dtype=np.float32)[:, :, ::-1]


@pytest.mark.slow
@needs_onnx
def test_a_tool_gets_the_tags_and_scores_of_evaluate(bundled, sample_dataset, tmp_path):
    from PIL import Image

    from deepdanbooru.dataset.records import load_records

    project, bundle, result = bundled
    assert result.exit_code == 0, result.output
    database, _ = sample_dataset
    # PNG copies: both sides then decode the same pixels (JPEG decoders differ by a few levels).
    images = []
    for index, source in enumerate(load_records(database, 1, ("jpg",)).paths()[:6]):
        images.append(tmp_path / f"image{index}.png")
        Image.open(source).convert("RGB").save(images[-1])

    with open(bundle / "selected_tags.csv", newline="") as stream:
        names = [row["name"] for row in csv.DictReader(stream)]
    session = onnxruntime.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    model_input = session.get_inputs()[0]
    assert model_input.name == "input" and session.get_outputs()[0].name == "predictions_sigmoid"
    assert isinstance(model_input.shape[0], str) and model_input.shape[1:] == [32, 32, 3]  # a symbolic batch
    size = model_input.shape[1]
    batch = np.stack([tool_preprocess(path, size) for path in images])
    tool_scores = session.run([session.get_outputs()[0].name], {model_input.name: batch})[0]

    evaluated = run_cli("evaluate", *images, "--project-path", project, "--threshold", "0", "--format", "json")
    assert evaluated.exit_code == 0, evaluated.output
    for line, scores in zip(evaluated.stdout.strip().splitlines(), tool_scores):
        ours = json.loads(line)["tags"]
        theirs = dict(zip(names, scores.tolist()))
        assert set(ours) == set(theirs)
        assert max(abs(ours[tag] - theirs[tag]) for tag in ours) < 1e-4
        assert {t for t, s in ours.items() if s >= 0.5} == {t for t, s in theirs.items() if s >= 0.5}
    assert np.ptp(tool_scores, axis=0).max() > 1e-3  # the scores depend on the image: agreement means something


@pytest.mark.slow
@needs_onnx
def test_existing_bundle_needs_overwrite_and_non_square_models_are_refused(bundled, tmp_path):
    project, bundle, result = bundled
    assert result.exit_code == 0, result.output
    again = run_cli("export-bundle", project, bundle, "--split", "all")
    assert again.exit_code == 2 and "already exists; use --overwrite" in again.output
    from deepdanbooru.models.builder import build_model

    wide = tmp_path / "wide.keras"
    build_model("resnet_small", (32, 48, 3), 18, seed=1).save(wide)
    refused = run_cli("export-bundle", project, tmp_path / "out", "--model-path", wide, "--split", "all")
    assert refused.exit_code == 2 and "the tools feed square RGB images" in refused.output
    assert not (tmp_path / "out").exists()


def test_without_onnx_packages_the_command_says_how_to_install(bundled, tmp_path, monkeypatch):
    from deepdanbooru.inference import convert

    monkeypatch.setattr(convert, "onnx_available", lambda: False)
    project = bundled[0]
    result = run_cli("export-bundle", project, tmp_path / "out")
    assert result.exit_code == 2
    assert "export-bundle needs the optional packages tf2onnx and onnxruntime" in result.output
    assert not (tmp_path / "out").exists()


def test_bundle_order_puts_ratings_general_character_first():
    from deepdanbooru.inference.bundle import bundle_order

    # tags.txt order: character, general, rating, unknown (general), copyright
    assert bundle_order([4, 0, 9, None, 3]) == [2, 1, 3, 0, 4]
