"""check-bundle: the bundle run as the tools run it, beside evaluate, on the same pictures."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from test_bundle import SIZE, make_project, needs_onnx, run_cli

pytest.importorskip("tensorflow")


def square_pictures(directory, count=6):
    from PIL import Image

    rng = np.random.default_rng(7)
    directory.mkdir()
    for index in range(count):
        blocks = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
        picture = Image.fromarray(np.kron(blocks, np.ones((SIZE // 4, SIZE // 4, 1), np.uint8)), "RGB")
        picture.save(directory / f"square{index}.png")
    return directory


@pytest.fixture(scope="module")
def checked(tmp_path_factory, sample_dataset):
    """A project whose model has thresholds beside it, bundled at the model's own size, and square pictures."""
    _, tags = sample_dataset
    root = tmp_path_factory.mktemp("check")
    project = make_project(root, sample_dataset, tags)
    uses = ["own", "fallback", "fallback", "withheld"]
    (project / "model-resnet_small.thresholds.csv").write_text(
        "tag,threshold,precision,recall,f1,support,ap,use,reason\n" + "".join(
            f"{tag},{0.45 + 0.01 * (index % 5)},0.5,0.5,0.5,9,0.5,{uses[index % 4]},why\n"
            for index, tag in enumerate(tags)))
    bundle = root / "bundle"
    result = run_cli("export-bundle", project, bundle, "--split", "all", "--size", SIZE)
    assert result.exit_code == 0, result.output
    return project, tags, bundle, square_pictures(root / "pictures")


def copy_bundle(bundle, destination, change=None):
    destination.mkdir()
    for path in bundle.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    if change is not None:
        path = destination / "selected_tags.csv"
        with open(path, newline="") as stream:
            rows = list(csv.reader(stream))
        change(rows)
        with open(path, "w", newline="") as stream:
            csv.writer(stream, lineterminator="\n").writerows(rows)
    return destination


@needs_onnx
def test_a_bundle_at_the_models_size_answers_as_evaluate_on_square_pictures(checked):
    project, _, bundle, pictures = checked
    result = run_cli("check-bundle", bundle, pictures, "--project-path", project)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Model: {project / 'model-resnet_small.keras'}")
    assert "per tag from" in lines[0] and "withheld (never emitted)" in lines[0]
    assert lines[1].startswith(f"Bundle: {bundle} (") and f"input {SIZE}x{SIZE}" in lines[1]
    summary = lines[2]
    assert summary.startswith("Same tags on 6 of 6 pictures; largest score difference 0.0000")
    assert summary.endswith("tolerance 0.05")


@needs_onnx
def test_shifted_rows_fail(checked, tmp_path):
    project, _, bundle, pictures = checked

    def shift(rows):  # the general rows' names moved down by one: every score is read as its neighbour's
        names = [row[1] for row in rows[5:]]
        for row, name in zip(rows[5:], names[-1:] + names[:-1]):
            row[1] = name

    shifted = copy_bundle(bundle, tmp_path / "shifted", shift)
    result = run_cli("check-bundle", shifted, pictures, "--project-path", project)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {shifted} does not answer as evaluate does: scores differ by up to ")
    assert "more than --tolerance 0.05" in last


@needs_onnx
def test_a_threshold_that_is_not_evaluates_fails_and_is_named(checked, tmp_path):
    project, tags, bundle, pictures = checked

    def loosen(rows):
        rows[5][4] = "0.01"

    loosened = copy_bundle(bundle, tmp_path / "loosened", loosen)
    result = run_cli("check-bundle", loosened, pictures, "--project-path", project)
    assert result.exit_code == 1, result.output
    assert f"threshold of {tags[0]}: 0.01 in selected_tags.csv, 0.45 in evaluate" in result.stdout
    assert "1 thresholds in selected_tags.csv are not evaluate's" in result.output


@needs_onnx
def test_a_picture_that_is_not_square_is_explained(checked, tmp_path):
    from PIL import Image

    project, _, bundle, _ = checked
    folder = tmp_path / "wide"
    folder.mkdir()
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (SIZE // 2, SIZE, 3), dtype=np.uint8), "RGB").save(folder / "wide.png")
    result = run_cli("check-bundle", bundle, folder, "--project-path", project, "--tolerance", "1")
    assert result.exit_code == 0, result.output
    summary = result.stdout.splitlines()[2]
    assert summary.startswith("Same tags on ") and summary.endswith("tolerance 1")
    difference = float(summary.split("largest score difference ")[1].split()[0])
    assert difference > 1e-3  # the tools' white square and evaluate's repeated border differ
    for line in result.stdout.splitlines()[3:]:
        assert f"{SIZE}x{SIZE // 2} is not square: the tools pad it to a white square, then resize" in line


@needs_onnx
@pytest.mark.parametrize("case, message", [
    ("no_folder", "is not a folder: give the folder export-bundle wrote"),
    ("no_model", "model.onnx: not found: BUNDLE must be a folder export-bundle wrote"),
    ("other_tags", "line 6: tag 'not_a_tag' is not one of the model's tags (a bundle of another model?)"),
    ("not_a_number", "line 6: best_threshold 'high' is not a number"),
    ("not_onnx", "model.onnx: onnxruntime cannot open it: "),
    ("no_pictures", "no image files found"),
])
def test_bad_bundles_get_one_line(checked, tmp_path, case, message):
    project, _, bundle, pictures = checked
    if case == "no_folder":
        target = tmp_path / "missing"
    elif case == "no_model":
        target = copy_bundle(bundle, tmp_path / "b")
        (target / "model.onnx").unlink()
    elif case == "other_tags":
        target = copy_bundle(bundle, tmp_path / "b", lambda rows: rows[5].__setitem__(1, "not_a_tag"))
    elif case == "not_a_number":
        target = copy_bundle(bundle, tmp_path / "b", lambda rows: rows[5].__setitem__(4, "high"))
    elif case == "not_onnx":
        target = copy_bundle(bundle, tmp_path / "b")
        (target / "model.onnx").write_text("not a model")
    else:
        target, pictures = bundle, tmp_path / "empty"
        pictures.mkdir()
    result = run_cli("check-bundle", target, pictures, "--project-path", project)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output and "Traceback" not in result.output
