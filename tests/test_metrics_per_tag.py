"""evaluate-project --metrics: one row per tag in --format json (per_tag) and --format csv, with the source's AP
before the first step where the project started from one. Expected figures are computed here from the model's
own scores."""

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_finetune_start import average_precision, labels, tiny_source
from train_helpers import make_project

from deepdanbooru.cli import main

MODEL_FILE = "model-resnet_small.keras"


@pytest.fixture(scope="module")
def measured(tmp_path_factory, sample_dataset):
    """A project whose final export is a tiny untrained network (no training needed to measure it), and the
    scores it gives the validation split: (project, plan, scores)."""
    import keras

    from deepdanbooru.pipeline import inference_dataset
    from deepdanbooru.training.export import export_model
    from deepdanbooru.training.train import plan_training

    project = make_project(tmp_path_factory.mktemp("per_tag") / "p", *sample_dataset, validation_fraction=0.5)
    plan = plan_training(project)
    export_model(tiny_source(len(plan.tags)), project / MODEL_FILE, tags=plan.tags)
    images = inference_dataset(plan.validation.paths(), height=32, width=32, batch_size=4, max_image_pixels=10 ** 8)
    model = keras.models.load_model(project / MODEL_FILE)
    scores = np.concatenate([np.asarray(model(batch["image"])) for batch in images]).astype(np.float64)
    return project, plan, scores


def run_metrics(project, *options):
    result = CliRunner().invoke(main, ["evaluate-project", str(project), "--metrics", "--model-path",
                                       str(project / MODEL_FILE), *options])
    assert result.exit_code == 0, result.output
    return result.output


def write_source_ap(project, ap, records):
    (project / "logs").mkdir(exist_ok=True)
    payload = {"source_model": "/somewhere/source.keras", "validation_records": records, "skipped_images": 0,
               "tags": len(ap), "map": None, "ap": ap, "support": {}}
    (project / "logs" / "source_tag_ap.json").write_text(json.dumps(payload))


def test_per_tag_rows_hold_each_tags_figures(measured):
    project, plan, scores = measured
    (project / "logs" / "source_tag_ap.json").unlink(missing_ok=True)
    output = json.loads(run_metrics(project, "--format", "json").strip().splitlines()[-1])
    rows = output["per_tag"]
    assert [row["tag"] for row in rows] == plan.tags
    assert output["source"] is None and all(row["source_ap"] is None for row in rows)
    truth = labels(plan.validation.tag_strings, plan.tags)
    threshold = output["metrics"]["threshold"]
    for index, row in enumerate(rows):
        positives = int(truth[:, index].sum())
        assert row["positives"] == positives, row
        expected_ap = average_precision(scores[:, index], truth[:, index])
        if positives == 0:
            assert row["ap"] is None and row["f1"] is None and row["f1_at_threshold"] is None, row
            continue
        assert row["ap"] == pytest.approx(expected_ap, abs=1e-6), row
        predicted = scores[:, index] >= threshold
        tp = int((predicted & truth[:, index]).sum())
        wrong = int((predicted != truth[:, index]).sum())
        assert row["f1_at_threshold"] == pytest.approx(2 * tp / (2 * tp + wrong), abs=1e-6), row
        assert 0.0 <= row["threshold"] <= 1.0 and 0.0 <= row["f1"] <= 1.0
        # Its own threshold needs min_support positives (and an AP and a gain that support it: docs/metrics.md).
        assert not row["calibrated"] or positives >= output["metrics"]["min_support"]
        if row["withheld"]:  # never emitted by default: nothing found
            assert row["f1"] == row["precision"] == row["recall"] == 0.0
    assert set(rows[0]) == {"tag", "positives", "ap", "f1", "threshold", "calibrated", "withheld", "precision",
                            "recall", "f1_at_threshold", "source_ap"}
    # The mean of the rows' AP is the scalar map.
    aps = [row["ap"] for row in rows if row["ap"] is not None]
    assert np.mean(aps) == pytest.approx(output["metrics"]["map"], abs=1e-5)


def test_source_ap_is_the_sources_own_on_the_same_posts(measured):
    project, plan, _ = measured
    known = {plan.tags[0]: 0.25, plan.tags[1]: None, plan.tags[2]: 1.0}
    write_source_ap(project, known, len(plan.validation))
    output = json.loads(run_metrics(project, "--format", "json").strip().splitlines()[-1])
    by_tag = {row["tag"]: row for row in output["per_tag"]}
    assert by_tag[plan.tags[0]]["source_ap"] == 0.25
    assert by_tag[plan.tags[1]]["source_ap"] is None  # known, but without a positive when it was measured
    assert by_tag[plan.tags[2]]["source_ap"] == 1.0
    assert all(by_tag[tag]["source_ap"] is None for tag in plan.tags[3:])  # tags the source did not know
    assert output["source"]["same_posts"] is True
    assert output["source"]["file"] == str(project / "logs" / "source_tag_ap.json")

    # Other posts than the source was measured on: no source figure is passed off as comparable.
    other = json.loads(run_metrics(project, "--format", "json", "--split", "all").strip().splitlines()[-1])
    assert other["source"]["same_posts"] is False and "not on these posts" in other["source"]["detail"]
    assert all(row["source_ap"] is None for row in other["per_tag"])
    write_source_ap(project, known, len(plan.validation) + 3)
    changed = json.loads(run_metrics(project, "--format", "json").strip().splitlines()[-1])
    assert changed["source"]["same_posts"] is False
    assert f"measured on {len(plan.validation) + 3} validation records, these are {len(plan.validation)}" \
        in changed["source"]["detail"]
    (project / "logs" / "source_tag_ap.json").unlink()


def test_the_text_output_ends_with_what_was_kept_where_the_source_measured_these_posts(measured):
    project, plan, _ = measured
    write_source_ap(project, {plan.tags[0]: 0.25, plan.tags[1]: None, plan.tags[2]: 1.0}, len(plan.validation))
    lines = run_metrics(project).splitlines()
    # Two tags the source knew have an AP; with a few validation posts neither has 10 positives.
    assert lines[-1].startswith("Kept from the source: none of the 2 tags it knew has 10 validation positives")
    assert not run_metrics(project, "--split", "all").splitlines()[-1].startswith("Kept from the source")
    (project / "logs" / "source_tag_ap.json").write_text("{\"ap\": [1, 2]}")
    assert run_metrics(project).splitlines()[-1].startswith("thresholds: ")  # the json output names the damage
    (project / "logs" / "source_tag_ap.json").unlink()
    assert run_metrics(project).splitlines()[-1].startswith("thresholds: ")


def test_csv_writes_the_same_rows(measured):
    project, plan, _ = measured
    write_source_ap(project, {plan.tags[0]: 0.5}, len(plan.validation))
    rows = json.loads(run_metrics(project, "--format", "json").strip().splitlines()[-1])["per_tag"]
    table = list(csv.DictReader(io.StringIO(run_metrics(project, "--format", "csv"))))
    assert list(table[0]) == list(rows[0])
    assert len(table) == len(rows)

    def cell(value):
        return "" if value is None else ("true" if value is True else "false") if isinstance(value, bool) \
            else str(value)

    assert [{key: cell(value) for key, value in row.items()} for row in rows] == table
    assert table[0]["source_ap"] == "0.5"
    (project / "logs" / "source_tag_ap.json").unlink()


def test_a_broken_source_file_is_named(measured):
    project, _, _ = measured
    (project / "logs").mkdir(exist_ok=True)
    (project / "logs" / "source_tag_ap.json").write_text("{\"ap\": [1, 2]}")
    result = CliRunner().invoke(main, ["evaluate-project", str(project), "--metrics", "--model-path",
                                       str(project / MODEL_FILE), "--format", "json"])
    (project / "logs" / "source_tag_ap.json").unlink()
    assert result.exit_code != 0
    assert "source_tag_ap.json: cannot be read as the source's AP per tag" in result.output
    assert "Traceback" not in result.output


def test_thresholds_csv_is_still_refused_with_metrics(measured, tmp_path):
    project, _, _ = measured
    thresholds = tmp_path / "thresholds.csv"
    thresholds.write_text("tag,threshold\n")
    result = CliRunner().invoke(main, ["evaluate-project", str(project), "--metrics", "--thresholds-csv",
                                       str(thresholds)])
    assert result.exit_code == 2 and "--thresholds-csv applies to tagging, not to --metrics" in result.output
