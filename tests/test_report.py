"""deepdanbooru report: the page's data, the run files it reads, bad input, and the page in a real browser."""

import json
import re
import time

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.report import summary
from deepdanbooru.report.collect import PageCollector
from deepdanbooru.report.runfiles import read_history
from deepdanbooru.scoring.metrics import ValidationMetrics

MODEL = "model-resnet_small.best.keras"


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def tiny_model(n_tags, seed=0):
    """A real Keras model of the project's input size: colour means -> one sigmoid per tag."""
    import keras

    rng = np.random.default_rng(seed)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    outputs = keras.layers.Dense(n_tags, activation="sigmoid", name="output",
                                 kernel_initializer=keras.initializers.Constant(rng.normal(0, 3, (3, n_tags))),
                                 bias_initializer=keras.initializers.Constant(rng.normal(0, 1, n_tags)))(x)
    return keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory, sample_dataset):
    """(model with one output per tag, model with one output too few)."""
    _, tags = sample_dataset
    folder = tmp_path_factory.mktemp("report_models")
    good, short = folder / "good.keras", folder / "short.keras"
    tiny_model(len(tags)).save(good)
    tiny_model(len(tags) - 1).save(short)
    return good, short


def write_run(project, n_tags):
    """The files a run writes, by hand: a history with two stops, best.json, state.json."""
    logs = project / "logs"
    logs.mkdir()
    start = 1_700_000_000.0
    rows = []
    for step in range(1, 9):
        # A 10-minute pause between steps 4 and 5 that no line records (an older history); a Ctrl-C at step 7,
        # resumed 30 s later from the checkpoint at step 6 (the lines of step 7 trained again).
        moment = start + step * 2 + (600 if step >= 5 else 0) + (30 if step >= 7 else 0)
        if step == 7:
            rows.append({"kind": "resume", "time": moment - 2, "used_epoch": 1, "used_minibatch": 6,
                         "used_sample": 24, "offset": 8, "random_seed": 1, "stopped_by": "Ctrl-C",
                         "stopped_step": 7, "stopped_time": moment - 31, "repeated_steps": 1})
        rows.append({"kind": "train", "time": moment, "used_epoch": step // 4, "used_minibatch": step,
                     "used_sample": step * 4, "offset": 0, "random_seed": 0, "loss": 1.0 / step,
                     "learning_rate": 0.001 if step < 6 else 0.0001, "samples_per_second": 2.0})
        if step % 4 == 0:
            rows.append({"kind": "validation", "time": moment + 1, "used_epoch": step // 4, "used_minibatch": step,
                         "used_sample": step * 4, "seconds": 1.0, "map": 0.2 * step / 4, "macro_f1": 0.1 * step / 4,
                         "calibrated_macro_f1": 0.15 * step / 4, "pr_f1": 0.12 * step / 4, "loss": 0.9 / step})
    (logs / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"kind": "tra')
    (project / "model-resnet_small.best.json").write_text(json.dumps(
        {"metric": "macro_f1", "value": 0.2, "used_minibatch": 8, "used_epoch": 2}))
    # A fine-tune's files: the source knew the first 10 tags (and one tags.txt lacks) and measured its AP on them.
    tags = (project / "tags.txt").read_text().split()
    (logs / "vocabulary.txt").write_text("# source.keras\n" + "".join(
        f"{'kept' if index < 10 else 'new'}\t{tag}\n" for index, tag in enumerate(tags)) + "dropped\told_tag\n")
    (logs / "source_tag_ap.json").write_text(json.dumps({"ap": {tag: 0.5 for tag in tags[:10]} | {tags[0]: None}}))
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "state.json").write_text(json.dumps(
        {"used_epoch": 2, "used_minibatch": 8, "epoch_count": 2, "complete": True, "source": None,
         "tag_count": n_tags}))


def trained(project, tags, model):
    """`project` (made by the sample_project fixture) given a model and a run's files, half its posts validation."""
    config = json.loads((project / "project.json").read_text())
    config["validation_fraction"] = 0.5
    (project / "project.json").write_text(json.dumps(config))
    (project / MODEL).write_bytes(model.read_bytes())
    write_run(project, len(tags))
    return project


@pytest.fixture
def project(sample_project, sample_dataset, model_files):
    return trained(sample_project, sample_dataset[1], model_files[0])


def page_data(page):
    text = page.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
    return text, json.loads(found.group(1))


# --- the numpy parts ---


def test_collector_keeps_each_tags_worst_pictures_and_each_pictures_mistakes():
    rng = np.random.default_rng(0)
    scores = rng.random((11, 5)).astype(np.float32)
    labels = rng.random((11, 5)) < 0.4
    collector = PageCollector(5, worst=2, kept_negatives=2)
    for start in range(0, 11, 4):
        collector.update(scores[start:start + 4], labels[start:start + 4], np.arange(start, min(start + 4, 11)))
    for tag in range(5):
        negatives, positives = collector.tag_candidates(tag)
        expected_fp = sorted((i for i in range(11) if not labels[i, tag]), key=lambda i: -scores[i, tag])[:2]
        expected_fn = sorted((i for i in range(11) if labels[i, tag]), key=lambda i: scores[i, tag])[:2]
        assert [picture for picture, _ in negatives] == expected_fp
        assert [picture for picture, _ in positives] == expected_fn
    thresholds = np.full(5, 0.5, dtype=np.float32)
    for index in range(11):
        errors = collector.picture_errors(index, thresholds)
        missed = {int(t) for t in np.flatnonzero(labels[index] & (scores[index] < 0.5))}
        wrong = {int(t) for t in np.flatnonzero(~labels[index] & (scores[index] >= 0.5))}
        assert {tag for tag, _ in errors["missed"]} == missed
        # Two negatives are kept per picture: the highest two, so the FP list is exact up to two.
        assert {tag for tag, _ in errors["wrong"]} == set(sorted(wrong, key=lambda t: -scores[index, t])[:2])
        assert errors["more_wrong"] == (len(wrong) >= 2)


def test_tag_curves_are_the_exact_counts_at_the_picked_thresholds():
    rng = np.random.default_rng(1)
    scores = rng.random((200, 3))
    labels = rng.random((200, 3)) < 0.3
    metrics = ValidationMetrics(3)
    metrics.update(scores, labels)
    thresholds, precision, recall = metrics.tag_curves(step=100)
    assert thresholds.tolist() == pytest.approx([i / 10 for i in range(11)])
    for tag in range(3):
        for k, threshold in enumerate(thresholds):
            predicted = scores[:, tag] >= threshold
            tp = np.sum(predicted & labels[:, tag])
            assert precision[tag, k] == pytest.approx(tp / max(predicted.sum(), 1), abs=1e-6)
            assert recall[tag, k] == pytest.approx(tp / labels[:, tag].sum(), abs=1e-6)


# --- the run files (standard library) ---


def test_history_stops_and_changed_keys(project):
    history = read_history(project / "logs" / "history.jsonl")
    assert len(history) == 11  # the torn last line is left out, as the trainer drops it
    found = summary.stops(history)
    assert [(stop.step, stop.reason, stop.reached) for stop in found] == [(5, "pause", 5), (6, "Ctrl-C", 7)]
    assert found[0].text() == "a pause of 9:59 at step 5 (seen in the times; no stop recorded)"
    assert found[1].text() == "Ctrl-C at step 7, resumed from the checkpoint at step 6 after 0:29 (1 step trained again)"
    assert [stop.label for stop in found] == ["pause", "Ctrl-C"]
    changed = {name: value for name, value, _ in summary.changed_keys(project)}
    assert changed["validation_fraction"] == 0.5 and changed["model"] == "resnet_small"
    assert "checkpoint_frequency_mb" not in changed


def test_history_stops_pass_over_a_hand_edited_line_with_text_for_numbers():
    history = [
        {"kind": "train", "time": 100.0, "used_minibatch": 1, "used_sample": 8, "samples_per_second": 8.0},
        {"kind": "train", "time": 2000.0, "used_minibatch": 2, "used_sample": "sixteen", "samples_per_second": "x"},
        {"kind": "train", "time": 2001.0, "used_minibatch": 3, "used_sample": 24, "samples_per_second": 8.0},
        {"kind": "train", "time": 5000.0, "used_minibatch": 4, "used_sample": 32, "samples_per_second": 8.0},
    ]
    # The edited line is passed over (no traceback); the other rows still show the long pause before step 4.
    assert [(stop.step, stop.reason) for stop in summary.stops(history)] == [(4, "pause")]


# --- the command ---


@pytest.mark.slow
def test_report_writes_the_page_with_the_figures_evaluate_project_measures(project, tmp_path):
    result = run_cli("report", project)
    assert result.exit_code == 0, result.output
    page, folder = project / "report.html", project / "report_files"
    assert f"Model: {project / MODEL} (the project's best export)" in result.output
    text, data = page_data(page)
    tags = (project / "tags.txt").read_text().split()
    assert data["tags"]["name"] == tags
    # The validation counts are the split's, and sum to the labels scored.
    assert sum(data["tags"]["validation"]) > 0
    assert data["validation_pictures"] == len(data["gallery"])  # a small split shows every picture
    for picture in data["pictures"]:
        assert (project / picture["thumb"]).is_file()
    assert {path.name for path in folder.iterdir()} == {f"{p['id']}.jpg" for p in data["pictures"]}
    assert not re.search(r"""(src|href)=["']?https?:""", text)
    # The source model's AP beside the fine-tune's, for the tags it measured; the grown vocabulary's groups.
    assert data["tags"]["source_ap"] == [None] + [0.5] * 9 + [None] * (len(tags) - 10)
    assert data["vocabulary"] == {"kept": list(range(10)), "new": list(range(10, len(tags))), "dropped": ["old_tag"]}
    assert "Grown vocabulary" in text and "10 tags kept" in text
    # The same figures as evaluate-project --metrics on the same model.
    measured = run_cli("evaluate-project", project, "--metrics", "--model-path", project / MODEL, "--format", "json")
    metrics = json.loads(measured.output.strip().splitlines()[-1])["metrics"]
    assert f"<th>macro-F1</th><td>{metrics['macro_f1']:.4f}</td>" in text
    assert f"<th>mAP</th><td>{metrics['map']:.4f}</td>" in text
    assert ("<th>Stops</th><td>2: a pause of 9:59 at step 5 (seen in the times; no stop recorded); Ctrl-C at step 7, "
            "resumed from the checkpoint at step 6 after 0:29 (1 step trained again)</td>") in text
    for chart in ("loss", "validation", "learning_rate"):
        assert f'id="chart-{chart}"><svg' in text
    # The source file names no record count, so its figures are not taken for these posts' in a headline row.
    assert "source tags kept" not in text
    # A second report replaces the folder and leaves no staging folder behind.
    (folder / "999999.jpg").write_bytes(b"x")  # the thumbnail of a post no longer shown
    source_file = project / "logs" / "source_tag_ap.json"
    source_file.write_text(json.dumps({**json.loads(source_file.read_text()),
                                       "validation_records": data["validation_pictures"]}))
    assert run_cli("report", project).exit_code == 0
    # Measured on as many posts: the row says what was kept (a few validation posts: too few to count).
    assert ("<th>source tags kept</th><td>not counted</td><td>none of the 9 tags it knew has 10 validation "
            "positives") in page.read_text()
    assert not (folder / "999999.jpg").exists()
    assert sorted(path.name for path in project.iterdir() if "_files" in path.name) == ["report_files"]


def assert_one_line_and_nothing_written(result, project, *words):
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for word in words:
        assert word in lines[0], lines[0]
    assert not (project / "report.html").exists() and not list(project.glob("*report_files*"))


def test_a_project_that_never_trained_says_which_command_to_run(sample_project):
    result = run_cli("report", sample_project)
    assert_one_line_and_nothing_written(result, sample_project, "not trained yet", "deepdanbooru train-project")


def test_a_model_whose_outputs_do_not_match_tags_txt(project, model_files):
    (project / MODEL).write_bytes(model_files[1].read_bytes())
    result = run_cli("report", project)
    tags = len((project / "tags.txt").read_text().split())
    assert_one_line_and_nothing_written(result, project, str(project / MODEL), f"lists {tags} tags")


@pytest.mark.parametrize("fraction, words", [(0, ["validation_fraction", "is 0", "train again"]),
                                             (0.0001, ["none of the", "validation split", "raise it"])])
def test_an_empty_validation_split_says_how_to_make_one(project, fraction, words):
    config = json.loads((project / "project.json").read_text())
    config["validation_fraction"] = fraction
    (project / "project.json").write_text(json.dumps(config))
    assert_one_line_and_nothing_written(run_cli("report", project), project, *words)


def test_output_must_be_an_html_file_in_an_existing_folder(project, tmp_path):
    assert_one_line_and_nothing_written(run_cli("report", project, "--output", tmp_path / "a.txt"), project, ".html")
    assert_one_line_and_nothing_written(run_cli("report", project, "--output", tmp_path / "no" / "a.html"), project,
                                        "not found")


def test_a_page_or_a_folder_report_did_not_write_is_not_replaced(tmp_path):
    from deepdanbooru.errors import UserError
    from deepdanbooru.report.make import _check_replaceable
    from deepdanbooru.report.page import GENERATOR

    page, folder = tmp_path / "page.html", tmp_path / "page_files"
    page.write_text("<html>mine</html>")
    with pytest.raises(UserError, match=r"page.html: not replaced: it is not a page deepdanbooru report wrote"):
        _check_replaceable(page)
    page.write_text(f'<html><head><meta charset="utf-8">\n<meta name="generator" content="{GENERATOR}">')
    _check_replaceable(page)
    page.write_text('<html><body><h1>p</h1>\n<p class="note">Made by deepdanbooru report at 2026-12-01 10:00 UTC')
    _check_replaceable(page)  # a page written before the generator line
    folder.mkdir()
    (folder / "12.jpg").write_bytes(b"thumbnail")
    (folder / ".DS_Store").write_bytes(b"a file browser's")
    _check_replaceable(page)
    (folder / "important.txt").write_text("keep")
    with pytest.raises(UserError, match=r"page_files: not replaced: the page's pictures go here, and important.txt "
                                        r"is not a thumbnail report wrote"):
        _check_replaceable(page)
    assert (folder / "important.txt").read_text() == "keep" and page.exists()


def test_a_folder_of_numbered_pictures_without_a_page_is_the_user_s(tmp_path):
    """With no page there, nothing shows report wrote the folder beside it: a user's 1001.jpg is not a thumbnail."""
    from deepdanbooru.errors import UserError
    from deepdanbooru.report.make import _check_replaceable, _output

    page, folder = tmp_path / "photos.html", tmp_path / "photos_files"
    folder.mkdir()
    (folder / ".DS_Store").write_bytes(b"a file browser's")
    _check_replaceable(page)  # an empty folder (a file browser's files aside) holds nothing to lose
    for name in ("1001.jpg", "1002.jpg"):
        (folder / name).write_bytes(b"a user's photo")
    with pytest.raises(UserError, match=r"photos_files: not replaced: the page's pictures go here, and 1001.jpg is "
                                        r"not a thumbnail of a page report wrote \(no photos.html beside it\)"):
        _check_replaceable(page)

    class Config:
        project_dir = tmp_path

    with pytest.raises(UserError, match="photos_files: not replaced"):
        _output(Config, page)
    assert sorted(p.name for p in folder.iterdir()) == [".DS_Store", "1001.jpg", "1002.jpg"]
    assert not page.exists()


def test_the_pictures_folder_is_swapped_in_whole_over_a_folder_or_a_file(tmp_path):
    from deepdanbooru.report.make import _swap_in

    def staged(content):
        staging = tmp_path / f".staging-{content}"
        staging.mkdir()
        (staging / "1.jpg").write_text(content)
        return staging

    folder = tmp_path / "report_files"
    folder.write_text("a file where the folder goes")
    _swap_in(staged("new"), folder)
    assert (folder / "1.jpg").read_text() == "new"
    _swap_in(staged("newer"), folder)
    assert (folder / "1.jpg").read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report_files"]  # no hidden leftovers
    with pytest.raises(FileNotFoundError):
        _swap_in(tmp_path / ".gone", folder)  # the new folder cannot take its name: the old one stays
    assert (folder / "1.jpg").read_text() == "newer" and sorted(p.name for p in tmp_path.iterdir()) == ["report_files"]


def test_a_run_logged_once_is_drawn_as_its_point():
    """A line needs two points: with one logged step the loss and learning-rate charts showed an empty frame."""
    pytest.importorskip("matplotlib")
    from deepdanbooru.report.charts import run_charts

    def marked(svg, colour):  # a marker of the series' colour (the ticks are markers too, in black)
        return re.search(rf'<use [^>]*style="[^"]*stroke: {colour}', svg) is not None

    charts = run_charts([{"used_minibatch": 5, "loss": 0.7, "learning_rate": 0.001}], [], [])
    assert marked(charts["loss"], "#1f77b4") and marked(charts["learning_rate"], "#2ca02c")
    longer = run_charts([{"used_minibatch": n, "loss": 1 / n, "learning_rate": 0.001} for n in range(1, 6)], [], [])
    assert not marked(longer["loss"], "#1f77b4")  # a line alone once there is one
