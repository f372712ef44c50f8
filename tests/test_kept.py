"""The closing "Kept from the source" line of a fine-tune: which tags the source knew lost AP, counted on the
tags with enough validation positives, and when the line is said."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from deepdanbooru.scoring.kept import kept, kept_line
from deepdanbooru.training.kept import KeptMonitor

SOURCE_AP = {"flag": 0.90, "face": 0.70, "objects": 0.24, "man": 0.52, "rare": 0.5, "absent": None}
SUPPORT = {"flag": 49, "face": 22, "objects": 33, "man": 16, "rare": 3, "absent": 0}


def test_counts_only_tags_with_enough_positives_and_orders_the_largest_fall_first():
    now = {"flag": 0.85, "face": 0.75, "objects": 0.15, "man": 0.51, "rare": 0.0, "absent": None, "new": 0.4}
    figures = kept(SOURCE_AP, SUPPORT, now)
    assert figures.known == 5 and figures.measured == 4  # "rare" has 3 positives, "absent" no AP
    assert [tag for tag, _, _ in figures.lost] == ["objects", "flag"]  # -0.09 before -0.05; man -0.01 is kept
    assert figures.gained == 1  # face +0.05
    assert figures.before == pytest.approx((0.90 + 0.70 + 0.24 + 0.52) / 4)
    assert figures.after == pytest.approx((0.85 + 0.75 + 0.15 + 0.51) / 4)
    assert kept_line(figures) == (
        "Kept from the source: of the 4 tags it knew with >= 10 validation positives, 2 lost more than 0.02 AP "
        "(objects 0.240 -> 0.150, flag 0.900 -> 0.850), 1 gained; their mean AP 0.590 -> 0.565; per tag: "
        "evaluate-project --metrics --format json (source_ap), or the report's source model AP column")


def test_a_fall_within_the_margin_is_not_a_loss_and_nan_counts_as_no_figure():
    figures = kept({"a": 0.5, "b": 0.5}, {"a": 10, "b": 10}, {"a": 0.485, "b": math.nan})
    assert figures.measured == 1 and figures.lost == () and figures.gained == 0
    assert "none lost more than 0.02 AP, 0 gained; their mean AP 0.500 -> 0.485" in kept_line(figures)


def test_more_lost_tags_than_named_are_counted():
    source = {f"t{i}": 0.9 for i in range(5)}
    figures = kept(source, {tag: 20 for tag in source}, {f"t{i}": 0.8 - i / 100 for i in range(5)})
    assert "5 lost more than 0.02 AP (t4 0.900 -> 0.760, t3 0.900 -> 0.770, t2 0.900 -> 0.780, and 2 more)" \
        in kept_line(figures)


def test_without_enough_positives_the_line_says_so_rather_than_counting():
    line = kept_line(kept({"a": 0.5, "b": 0.7}, {"a": 2, "b": 9}, {"a": 0.1, "b": 0.1}))
    assert line.startswith("Kept from the source: none of the 2 tags it knew has 10 validation positives")


def report(tags, values, records=20, positives=12):
    return SimpleNamespace(records=records, result={"per_tag": {
        "ap": np.array([values[tag] for tag in tags], dtype=np.float64), "support": np.full(len(tags), positives)}})


@pytest.mark.parametrize("end", ["on_train_end", "on_train_stopped"])
def test_the_monitor_compares_the_last_validation_with_the_written_start(tmp_path, end):
    tags = ["flag", "new", "face"]
    (tmp_path / "source_tag_ap.json").write_text(json.dumps(
        {"validation_records": 20, "ap": {"flag": 0.9, "face": 0.7}, "support": {"flag": 12, "face": 11}}))
    lines = []
    monitor = KeptMonitor(tmp_path, tags, lines.append)
    monitor.on_validation(report(tags, {"flag": 0.1, "new": 0.2, "face": 0.1}), {})
    monitor.on_validation(report(tags, {"flag": 0.8, "new": 0.5, "face": 0.75}), {})  # the last one counts
    getattr(monitor, end)(None)
    assert len(lines) == 1
    assert lines[0].startswith("Kept from the source: of the 2 tags it knew with >= 10 validation positives, "
                               "1 lost more than 0.02 AP (flag 0.900 -> 0.800), 1 gained; their mean AP 0.800 -> 0.775")


def test_the_monitor_says_nothing_without_a_source_a_validation_or_a_readable_file(tmp_path):
    lines = []
    tags = ["flag"]
    monitor = KeptMonitor(tmp_path, tags, lines.append)
    monitor.on_validation(report(tags, {"flag": 0.5}), {})
    monitor.on_train_end(None)  # no source_tag_ap.json: a run from scratch
    (tmp_path / "source_tag_ap.json").write_text("{not json")
    monitor.on_train_end(None)
    (tmp_path / "source_tag_ap.json").write_text(json.dumps(
        {"validation_records": 20, "ap": {"flag": 0.9}, "support": {"flag": 30}}))
    KeptMonitor(tmp_path, tags, lines.append).on_train_end(None)  # no validation this run
    other = KeptMonitor(tmp_path, tags, lines.append)
    other.on_validation(report(tags, {"flag": 0.5}, records=21), {})
    other.on_train_end(None)  # the split changed since the source was measured: other posts
    assert lines == []


def test_the_report_row_counts_only_where_the_source_measured_as_many_posts():
    from deepdanbooru.report.summary import kept_rows

    tags = ["flag", "face", "new"]
    result = {"per_tag": {"ap": np.array([0.8, 0.75, 0.3]), "support": np.array([12, 11, 4])}}
    source = {"validation_records": 40, "ap": {"flag": 0.9, "face": 0.7}, "support": {}}
    [(figure, value, detail)] = kept_rows(source, tags, result, 40)
    assert (figure, value) == ("source tags kept", "1 of 2 lost")
    assert detail.startswith("of the 2 tags it knew with >= 10 validation positives, 1 lost more than 0.02 AP "
                             "(flag 0.900 -> 0.800), 1 gained; their mean AP 0.800 -> 0.775; AP against the source's")
    assert kept_rows(source, tags, result, 41) == []  # other posts: not comparable
    assert kept_rows(None, tags, result, 40) == [] and kept_rows({"ap": [1]}, tags, result, 40) == []
