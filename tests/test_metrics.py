"""Streaming validation metrics and thresholds against hand-computed values."""

import csv
import json
import math

import numpy as np
import pytest

from deepdanbooru.errors import ModelError
from deepdanbooru.scoring.metrics import (
    ValidationMetrics,
    is_improvement,
    read_thresholds_csv,
    scalar_metrics,
    write_metrics_json,
    write_thresholds_csv,
)
from deepdanbooru.scoring.thresholds import best_threshold_indices

# Four samples, three tags. Tag 0: two positives, one hit, one miss, one false
# alarm. Tag 1: one positive and no prediction at all. Tag 2: no positive, one
# false alarm. Scores sit inside bins (bins=10) so no value lies on an edge.
CRAFTED_LABELS = np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=np.float32)
CRAFTED_SCORES = np.array([
    [0.93, 0.22, 0.63],
    [0.43, 0.13, 0.03],
    [0.73, 0.33, 0.47],
    [0.23, 0.07, 0.13],
])


def crafted_result(**options):
    metrics = ValidationMetrics(3, threshold=0.5, bins=10, **options)
    metrics.update(CRAFTED_SCORES, CRAFTED_LABELS, loss_sum=2.0)
    return metrics.result()


def test_working_threshold_metrics_match_hand_computation():
    result = crafted_result()
    per_tag = result["per_tag"]
    assert per_tag["tp"].tolist() == [1, 0, 0]
    assert per_tag["fp"].tolist() == [1, 0, 1]
    assert per_tag["fn"].tolist() == [1, 1, 0]
    assert per_tag["support"].tolist() == [2, 1, 0]
    assert result["samples"] == 4
    assert result["positives"] == 3
    assert result["tags_with_positives"] == 2
    assert result["loss"] == pytest.approx(0.5)
    # Pooled: tp 1, fp 2, fn 2, tn 12 - 5 = 7.
    assert result["micro_precision"] == pytest.approx(1 / 3)
    assert result["micro_recall"] == pytest.approx(1 / 3)
    assert result["micro_f1"] == pytest.approx(2 / 6)
    assert result["mcc"] == pytest.approx((1 * 7 - 2 * 2) / math.sqrt(3 * 3 * 9 * 9))


def test_macro_averages_skip_tags_without_positives():
    result = crafted_result()
    # Tag 0: P = R = F1 = 1/2. Tag 1 has a positive but no prediction: P = R = F1 = 0.
    # Tag 2 has no positive and is left out (over all three tags it would be 1/6).
    assert result["macro_precision"] == pytest.approx(0.25)
    assert result["macro_recall"] == pytest.approx(0.25)
    assert result["macro_f1"] == pytest.approx(0.25)


def test_average_precision_by_hand():
    result = crafted_result()
    ap = result["per_tag"]["ap"]
    # Tag 0 ranked: 0.93+, 0.73-, 0.43+, 0.23- -> (1/2)(1) + (1/2)(2/3).
    assert ap[0] == pytest.approx(5 / 6)
    # Tag 1's only positive (0.33) outranks its negatives.
    assert ap[1] == pytest.approx(1.0)
    assert math.isnan(ap[2])
    assert result["map"] == pytest.approx((5 / 6 + 1) / 2)


def test_perfect_and_inverted_predictions():
    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    perfect = ValidationMetrics(2, bins=100)
    perfect.update(labels * 0.9 + 0.05, labels)
    result = perfect.result()
    for key in ("micro_f1", "macro_f1", "map", "mcc", "global_threshold_f1", "calibrated_macro_f1"):
        assert result[key] == pytest.approx(1.0), key
    inverted = ValidationMetrics(2, bins=100)
    inverted.update((1 - labels) * 0.9 + 0.05, labels)
    assert inverted.result()["mcc"] == pytest.approx(-1.0)
    assert inverted.result()["micro_f1"] == 0.0


# Threshold search, bins=10. Tag A: positives 0.83 0.62 0.35, negatives 0.55 and
# lower. Tag B: one positive 0.95, a negative 0.75. Tag C: no positive.
SEARCH_SCORES = np.array([
    # A     B     C
    [0.83, 0.95, 0.45],
    [0.62, 0.75, 0.01],
    [0.35, 0.01, 0.01],
    [0.55, 0.01, 0.01],
    [0.05, 0.01, 0.01],
    [0.02, 0.01, 0.01],
])
SEARCH_LABELS = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])


def search_result(min_support):
    metrics = ValidationMetrics(3, threshold=0.5, bins=10, min_support=min_support)
    metrics.update(SEARCH_SCORES, SEARCH_LABELS)
    return metrics.result()


def test_global_threshold_maximises_micro_f1():
    result = search_result(min_support=2)
    # Pooled micro-F1 by edge: 0.9 -> 2/5, 0.8 -> 4/6, 0.7 -> 4/7, 0.6 -> 6/8 (tp 3, fp 1, fn 1),
    # 0.5 -> 6/9, 0.4 -> 6/10, 0.3 .. 0.1 -> 8/11, 0.0 -> lower.
    assert result["global_threshold"] == pytest.approx(0.6)
    assert result["global_threshold_precision"] == pytest.approx(0.75)
    assert result["global_threshold_recall"] == pytest.approx(0.75)
    assert result["global_threshold_f1"] == pytest.approx(0.75)


def test_per_tag_thresholds_and_fallback():
    result = search_result(min_support=2)
    per_tag = result["per_tag"]
    # Tag A: F1 6/7 at edges 0.1, 0.2, 0.3 (same counts): the middle, 0.2.
    assert per_tag["threshold"][0] == pytest.approx(0.2)
    assert per_tag["precision"][0] == pytest.approx(0.75)
    assert per_tag["recall"][0] == pytest.approx(1.0)
    assert per_tag["f1"][0] == pytest.approx(6 / 7)
    # Tag B has one positive < min_support: it shares the fallback, the micro-F1-best threshold over the tags
    # without their own (B and C): 0.8 and 0.9 give F1 1 there (0.75 is a false alarm), the middle is 0.8,
    # better than the working 0.5 on them.
    assert result["fallback_threshold"] == pytest.approx(0.8)
    assert result["fallback_threshold_micro_f1"] == pytest.approx(1.0)
    assert result["fallback_threshold_micro_f1_at_threshold"] == pytest.approx(2 / 3)
    assert per_tag["threshold"][1] == pytest.approx(0.8)
    assert per_tag["precision"][1] == pytest.approx(1.0)
    assert per_tag["f1"][1] == pytest.approx(1.0)
    # Tag C: no positives, the fallback, nothing predicted at 0.8.
    assert per_tag["threshold"][2] == pytest.approx(0.8)
    assert (per_tag["precision"][2], per_tag["recall"][2], per_tag["f1"][2]) == (0.0, 0.0, 0.0)
    assert per_tag["calibrated"].tolist() == [True, False, False]
    assert per_tag["withheld"].tolist() == [False, False, False]
    assert result["calibrated_tags"] == 1 and result["withheld_tags"] == 0
    assert result["calibrated_macro_f1"] == pytest.approx((6 / 7 + 1) / 2)


def test_min_support_one_calibrates_single_positive_tag():
    per_tag = search_result(min_support=1)["per_tag"]
    # Tag B: F1 1 at edges 0.8 and 0.9; middle (floor) 0.8.
    assert per_tag["threshold"][1] == pytest.approx(0.8)
    assert per_tag["f1"][1] == pytest.approx(1.0)
    assert per_tag["calibrated"].tolist() == [True, True, False]


def test_best_threshold_indices_takes_middle_of_highest_maximal_run():
    curves = np.array([
        [0.1, 0.5, 0.5, 0.5, 0.2],
        [0.9, 0.1, 0.9, 0.9, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.7],
    ])
    assert best_threshold_indices(curves).tolist() == [2, 2, 2, 4]


def exact_average_precision(scores, positive):
    """Non-interpolated AP with tied scores taken together (each distinct score is one threshold)."""
    total = positive.sum()
    ap, previous_tp = 0.0, 0
    for value in np.unique(scores)[::-1]:
        chosen = scores >= value
        tp = int((chosen & positive).sum())
        ap += (tp - previous_tp) / total * tp / chosen.sum()
        previous_tp = tp
    return ap


def test_average_precision_is_exact_when_distinct_scores_have_distinct_bins():
    rng = np.random.default_rng(3)
    bins = 20
    scores = (rng.integers(0, bins, size=(60, 4)) + 0.5) / bins  # bin centres, many ties
    labels = rng.random((60, 4)) < 0.3
    metrics = ValidationMetrics(4, bins=bins)
    metrics.update(scores, labels)
    ap = metrics.result()["per_tag"]["ap"]
    for tag in range(4):
        assert ap[tag] == pytest.approx(exact_average_precision(scores[:, tag], labels[:, tag]), abs=1e-12)


def test_average_precision_approximation_with_continuous_scores():
    rng = np.random.default_rng(4)
    labels = rng.random((400, 6)) < 0.2
    scores = np.clip(0.3 * labels + rng.random((400, 6)) * 0.7, 0, 1)
    metrics = ValidationMetrics(6, bins=1000)
    metrics.update(scores, labels)
    result = metrics.result()
    exact = [exact_average_precision(scores[:, tag], labels[:, tag]) for tag in range(6)]
    np.testing.assert_allclose(result["per_tag"]["ap"], exact, atol=2e-3)
    assert result["map"] == pytest.approx(np.mean(exact), abs=2e-3)


def test_counts_at_chosen_thresholds_are_exact_even_on_bin_edges():
    rng = np.random.default_rng(5)
    bins = 10
    # float32 scores, a quarter of them exactly on float32 renderings of edges, plus 0 and 1.
    scores = rng.random((300, 5)).astype(np.float32)
    on_edge = rng.random((300, 5)) < 0.25
    scores[on_edge] = (rng.integers(0, bins + 1, size=on_edge.sum()) / bins).astype(np.float32)
    labels = rng.random((300, 5)) < 0.4
    metrics = ValidationMetrics(5, bins=bins, min_support=1)
    metrics.update(scores, labels)
    result = metrics.result()
    per_tag = result["per_tag"]
    for tag in range(5):
        chosen = scores[:, tag] >= per_tag["threshold"][tag]
        tp = (chosen & labels[:, tag]).sum()
        assert per_tag["predicted"][tag] == chosen.sum()
        if per_tag["withheld"][tag]:  # never emitted by default: nothing found
            assert per_tag["precision"][tag] == per_tag["recall"][tag] == 0.0
            continue
        assert per_tag["precision"][tag] == pytest.approx(tp / max(chosen.sum(), 1))
        assert per_tag["recall"][tag] == pytest.approx(tp / labels[:, tag].sum())
    chosen = scores >= result["global_threshold"]
    tp = (chosen & labels).sum()
    assert result["global_threshold_precision"] == pytest.approx(tp / chosen.sum())
    assert result["global_threshold_recall"] == pytest.approx(tp / labels.sum())


def test_working_threshold_off_the_bin_edges_is_counted_exactly():
    rng = np.random.default_rng(6)
    scores = rng.random((200, 4))
    labels = rng.random((200, 4)) < 0.5
    metrics = ValidationMetrics(4, threshold=0.537, bins=10)
    metrics.update(scores, labels)
    per_tag = metrics.result()["per_tag"]
    predicted = scores >= 0.537
    assert per_tag["tp"].tolist() == (predicted & labels).sum(axis=0).tolist()
    assert per_tag["fp"].tolist() == (predicted & ~labels).sum(axis=0).tolist()
    assert per_tag["fn"].tolist() == (~predicted & labels).sum(axis=0).tolist()


def test_streaming_in_several_updates_equals_one_update():
    rng = np.random.default_rng(7)
    labels = rng.random((103, 7)) < 0.3
    scores = rng.random((103, 7)).astype(np.float32)
    losses = rng.random(103)
    whole = ValidationMetrics(7, bins=50, min_support=3)
    whole.update(scores, labels, loss_sum=losses.sum())
    parts = ValidationMetrics(7, bins=50, min_support=3)
    start = 0
    for size in (1, 10, 0, 50, 42):
        parts.update(scores[start:start + size], labels[start:start + size], loss_sum=losses[start:start + size].sum())
        start += size
    one, many = whole.result(), parts.result()
    assert many["loss"] == pytest.approx(one["loss"])
    for key in one:
        if key == "per_tag":
            for name, values in one["per_tag"].items():
                np.testing.assert_array_equal(many["per_tag"][name], values, err_msg=name)
        elif key != "loss":
            assert many[key] == one[key], key


def test_empty_accumulator_reports_zeros_and_no_loss():
    result = ValidationMetrics(3, threshold=0.4, bins=10).result()
    assert result["samples"] == 0
    assert result["loss"] is None
    assert result["micro_f1"] == result["macro_f1"] == result["map"] == result["mcc"] == 0.0
    assert result["global_threshold"] == 0.4
    assert result["per_tag"]["threshold"].tolist() == [0.4, 0.4, 0.4]


def test_loss_is_mean_over_batches_that_supplied_one():
    metrics = ValidationMetrics(2, bins=10)
    metrics.update(np.full((2, 2), 0.5), np.zeros((2, 2)), loss_sum=3.0)
    metrics.update(np.full((3, 2), 0.5), np.zeros((3, 2)))
    assert metrics.result()["loss"] == pytest.approx(1.5)


@pytest.mark.parametrize("scores, labels, message", [
    (np.zeros((2, 3)), np.zeros((2, 2)), "shape"),
    (np.zeros((2, 2)), np.zeros((2, 2)), "shape"),
    (np.zeros(2), np.zeros(2), "shape"),
    (np.array([[0.2, 1.5, 0.1]]), np.zeros((1, 3)), "logits"),
    (np.array([[0.2, -0.1, 0.1]]), np.zeros((1, 3)), "logits"),
    (np.array([[0.2, np.nan, 0.1]]), np.zeros((1, 3)), "finite"),
])
def test_update_rejects_bad_input(scores, labels, message):
    with pytest.raises(ValueError, match=message):
        ValidationMetrics(3).update(scores, labels)


def test_constructor_rejects_bad_settings():
    for options in ({"n_tags": 0}, {"n_tags": 2, "threshold": 1.5}, {"n_tags": 2, "bins": 0},
                    {"n_tags": 2, "min_support": 0}):
        with pytest.raises(ValueError):
            ValidationMetrics(**options)


def test_thresholds_csv_round_trip(tmp_path):
    result = search_result(min_support=2)
    tags = ["tag_a", "b,with comma", 'c "quoted"']
    path = tmp_path / "model.thresholds.csv"
    write_thresholds_csv(path, tags, result)
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0].keys()) == ["tag", "threshold", "precision", "recall", "f1", "support", "ap", "use",
                                    "reason"]
    assert [row["tag"] for row in rows] == tags
    assert rows[0] == {"tag": "tag_a", "threshold": "0.2", "precision": "0.750000", "recall": "1.000000",
                       "f1": "0.857143", "support": "3", "ap": "0.916667", "use": "own",
                       "reason": "F1 0.857 at its own threshold against 0.667 at 0.5 (AP 0.917, 3 positives)"}
    assert (rows[1]["use"], rows[1]["reason"]) == ("fallback", "1 positives (under 2): the fallback 0.8")
    assert (rows[2]["support"], rows[2]["ap"], rows[2]["use"]) == ("0", "", "fallback")
    assert read_thresholds_csv(path) == {"tag_a": 0.2, "b,with comma": 0.8, 'c "quoted"': 0.8}
    assert [p.name for p in tmp_path.iterdir()] == ["model.thresholds.csv"]


def test_thresholds_csv_rejects_tag_count_mismatch(tmp_path):
    with pytest.raises(ValueError):
        write_thresholds_csv(tmp_path / "x.csv", ["only_one"], search_result(min_support=2))
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("text, where", [
    ("name,value\na,0.5\n", "header"),
    ("tag,threshold\na,0.5\nb,high\n", "line 3"),
    ("tag,threshold\na,1.5\n", "line 2"),
    ("tag,threshold\na,0.5\na,0.6\n", "line 3"),
    ("tag,threshold\na\n", "line 2"),
])
def test_read_thresholds_csv_names_file_and_line(tmp_path, text, where):
    path = tmp_path / "bad.thresholds.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelError) as error:
        read_thresholds_csv(path)
    assert str(error.value).startswith(f"{path}: {where}")


def test_metrics_json_holds_scalars_and_extra(tmp_path):
    result = crafted_result()
    path = tmp_path / "model.metrics.json"
    write_metrics_json(path, result, {"used_epoch": np.int64(3), "used_minibatch": 120})
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["used_epoch"] == 3 and data["used_minibatch"] == 120
    assert data["metrics"] == pytest.approx(scalar_metrics(result))
    assert "per_tag" not in data["metrics"]
    assert data["metrics"]["map"] == pytest.approx(11 / 12)

    empty = ValidationMetrics(2).result()
    write_metrics_json(path, empty)
    assert json.loads(path.read_text(encoding="utf-8"))["metrics"]["loss"] is None
    with pytest.raises(ValueError):
        write_metrics_json(path, empty, {"metrics": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.metrics.json"]


def test_is_improvement_respects_metric_direction():
    assert is_improvement("macro_f1", 0.4, None)
    assert is_improvement("macro_f1", 0.5, 0.4)
    assert not is_improvement("macro_f1", 0.4, 0.4)
    assert is_improvement("loss", 0.3, 0.4)
    assert not is_improvement("loss", 0.5, 0.4)
    assert not is_improvement("map", float("nan"), None)
    assert not is_improvement("loss", None, 0.4)


@pytest.mark.parametrize("bins", [10, 1000, 100_000])
def test_slots_agree_with_edge_comparisons_next_to_every_edge(bins):
    edges = np.arange(bins + 1) / bins
    sample = edges[np.linspace(0, bins, 200).astype(int)]
    values = np.concatenate([sample, np.nextafter(sample, 0.0), np.nextafter(sample, 1.0),
                             sample.astype(np.float32).astype(np.float64)])
    values = np.clip(values, 0.0, 1.0)
    metrics = ValidationMetrics(1, bins=bins)
    expected = np.searchsorted(edges, values, side="right") - 1
    assert metrics._slots(values.reshape(-1, 1)).ravel().tolist() == expected.tolist()


def test_published_figures_on_a_case_with_a_known_equal_point():
    """P=R, macro-F1 and macro-MCC at 0.4, overall and per category, against hand-computed values.

    Tag 0 (general): positives score .9 .8 .3, negatives .7 .2 .1: for thresholds in (0.3, 0.7]
    two of three positives and one of three negatives pass, so P = R = 2/3 there and below 0.3
    recall is 1 with precision 3/4. Tag 1 (character): positives .95 .6, negatives .5 .45 .05 .04:
    P = R = 1 on (0.5, 0.6]. Tag 2 has no positive and stays out of every macro figure.
    """
    scores = np.array([[.9, .8, .3, .7, .2, .1], [.95, .6, .5, .45, .05, .04], [.9, .1, .1, .1, .1, .1]]).T
    labels = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]).T
    metrics = ValidationMetrics(3, categories={"general": [0, 2], "character": [1]})
    metrics.update(scores, labels)
    result = metrics.result()
    # The lowest bin edge where precision reaches recall.
    assert result["general_pr_threshold"] == pytest.approx(0.301)
    assert result["general_pr_precision"] == result["general_pr_recall"] == pytest.approx(2 / 3)
    assert result["general_pr_f1"] == pytest.approx(2 / 3)
    assert result["general_pr_tags"] == 1
    assert result["character_pr_threshold"] == pytest.approx(0.501)
    assert result["character_pr_f1"] == 1.0
    # Both tags together: macro P = macro R = (2/3 + 1) / 2 first at 0.501.
    assert result["pr_threshold"] == pytest.approx(0.501)
    assert result["pr_precision"] == result["pr_recall"] == pytest.approx(5 / 6)
    # At 0.4: tag 0 tp 2 fp 1 fn 1 tn 2 (MCC 3/9); tag 1 tp 2 fp 2 fn 0 tn 2 (MCC 4/8); F1 2/3 each.
    assert result["general_macro_f1_040"] == pytest.approx(2 / 3)
    assert result["general_macro_mcc_040"] == pytest.approx(1 / 3)
    assert result["character_macro_mcc_040"] == pytest.approx(0.5)
    assert result["macro_f1_040"] == pytest.approx(2 / 3)
    assert result["macro_mcc_040"] == pytest.approx((1 / 3 + 0.5) / 2)
    # Without categories only the overall figures appear; they do not depend on the categories.
    plain = ValidationMetrics(3)
    plain.update(scores, labels)
    plain_result = plain.result()
    assert not any(key.startswith(("general_", "character_")) for key in plain_result)
    assert plain_result["pr_threshold"] == result["pr_threshold"]


def test_equal_point_bisection():
    from deepdanbooru.scoring.thresholds import equal_point

    recall = np.linspace(1.0, 0.0, 11)
    assert equal_point(np.full(11, 0.5), recall) == 5
    assert equal_point(np.full(11, 0.44), recall) == 6  # 0.4 is nearer 0.44 than 0.5 is
    assert equal_point(np.ones(11), recall) == 0  # precision already at recall at threshold 0
    assert equal_point(np.zeros(11), recall + 1) == 10  # never meets: the top of the range


def test_rare_tags_fall_back_to_what_measures_better_than_the_working_threshold_not_the_global_one():
    # One frequent tag scores low (positives 0.15, negatives 0.05): the global threshold follows it down.
    # Nine rare tags (3 positives each, under min_support) score their positives 0.7 and a few negatives
    # 0.25: right at 0.5, wrong at the low global threshold. This is a fine-tune with few calibrated tags,
    # where the global threshold once made the defaults worse than 0.5.
    samples, tags = 200, 10
    scores = np.full((samples, tags), 0.05)
    labels = np.zeros((samples, tags))
    labels[:100, 0] = 1
    scores[:, 0] = np.where(labels[:, 0] == 1, 0.15, 0.05)
    for tag in range(1, tags):
        rows = np.arange(tag * 10, tag * 10 + 3)
        labels[rows, tag] = 1
        scores[rows, tag] = 0.7
        scores[tag * 10 + 3: tag * 10 + 9, tag] = 0.25
    metrics = ValidationMetrics(tags, threshold=0.5, bins=100, min_support=10)
    metrics.update(scores, labels)
    result = metrics.result()
    assert result["calibrated_tags"] == 1 and result["fallback_tags"] == 9
    assert result["global_threshold"] < 0.25
    assert 0.25 < result["fallback_threshold"] <= 0.7
    assert result["calibrated_macro_f1"] >= result["macro_f1"]
    assert result["calibrated_tags_f1"] >= result["calibrated_tags_f1_at_threshold"]
    assert result["fallback_tags_f1"] == result["fallback_tags_f1_at_threshold"] == 1.0
    # Both averages are over the same tags, the weighted means of their parts.
    for whole, own, at_threshold in (("calibrated_macro_f1", "calibrated_tags_f1", "fallback_tags_f1"),
                                     ("macro_f1", "calibrated_tags_f1_at_threshold", "fallback_tags_f1_at_threshold")):
        assert result[whole] == pytest.approx((1 * result[own] + 9 * result[at_threshold]) / 10)


def _policy_result(scores, labels, threshold=0.5, min_support=10):
    metrics = ValidationMetrics(scores.shape[1], threshold=threshold, bins=100, min_support=min_support)
    metrics.update(scores, labels)
    return metrics.result()


def test_own_threshold_needs_positives_an_ap_and_a_gain_over_the_working_threshold():
    rng = np.random.default_rng(0)
    samples = 400
    labels = np.zeros((samples, 4))
    labels[:40] = 1
    scores = np.full((samples, 4), 0.01)
    # 0: well ranked, positives at 0.3 (missed at 0.5): its own threshold gains.
    scores[:40, 0] = 0.3
    # 1: well ranked, positives at 0.8: 0.5 is as good as any, no gain.
    scores[:40, 1] = 0.8
    # 2: ranked at random (AP ~0.1): its F1-best threshold is a fit to noise.
    scores[:, 2] = rng.random(samples) * 0.4
    # 3: well ranked but only 5 positives.
    labels[5:, 3] = 0
    scores[:5, 3] = 0.3
    result = _policy_result(scores, labels)
    per_tag = result["per_tag"]
    assert per_tag["calibrated"].tolist() == [True, False, False, False]
    reasons = per_tag["reason"]
    assert reasons[0].startswith("F1 1.000 at its own threshold against 0.000 at 0.5")
    assert reasons[1].startswith("its own threshold gains under 0.02 F1")
    assert reasons[2].startswith("AP 0.") and "(under 0.2)" in reasons[2]
    assert reasons[3].startswith("5 positives (under 10)")


def test_mostly_wrong_and_everywhere_tags_are_withheld():
    samples = 100
    labels = np.zeros((samples, 3))
    scores = np.full((samples, 3), 0.01)
    # 0: 20 predictions at the working threshold, 1 of them right (precision 0.05): withheld.
    labels[0, 0] = 1
    scores[:20, 0] = 0.9
    # 1: on 80 of 100 pictures, carried by 10 of them: withheld (lands on most pictures, mostly wrongly).
    labels[:10, 1] = 1
    scores[:80, 1] = 0.9
    # 2: on 60 pictures, carried by 55 of them: that common, kept.
    labels[:55, 2] = 1
    scores[:60, 2] = 0.9
    result = _policy_result(scores, labels, min_support=1000)
    per_tag = result["per_tag"]
    assert per_tag["withheld"].tolist() == [True, True, False]
    assert result["withheld_tags"] == 2
    assert per_tag["reason"][0].startswith("mostly wrong on validation: 20 predictions")
    assert per_tag["reason"][1].startswith("would land on 80 of 100 validation pictures, mostly wrongly")
    # Withheld: nothing found, so F1 0 where the tag has positives.
    assert per_tag["f1"][0] == per_tag["f1"][1] == 0.0 and per_tag["f1"][2] > 0.9


def test_a_withheld_row_is_read_as_never_emitted(tmp_path):
    from deepdanbooru.inference.output import select_tags, threshold_vector

    path = tmp_path / "m.thresholds.csv"
    path.write_text("tag,threshold,use,reason\na,0.4,own,x\nb,0.5,withheld,mostly wrong\nc,0.6,fallback,y\n")
    assert read_thresholds_csv(path) == {"a": 0.4, "b": math.inf, "c": 0.6}
    vector = threshold_vector(["a", "b", "c"], 0.5, path)
    assert [tag for tag, _ in select_tags(["a", "b", "c"], np.array([1.0, 1.0, 1.0]), vector)] == ["a", "c"]
    path.write_text("tag,threshold,use\na,0.4,sometimes\n")
    with pytest.raises(ModelError, match="line 2.*use 'sometimes'"):
        read_thresholds_csv(path)


def test_the_mean_over_an_empty_group_of_tags_is_shown_as_none_not_zero():
    from deepdanbooru.inference.project_metrics import group_mean_text

    scalars = {"calibrated_tags": 0, "calibrated_tags_f1": 0.0, "fallback_tags": 3, "fallback_tags_f1": 0.25}
    assert group_mean_text("calibrated_tags_f1", scalars) == "- (no calibrated tag)"
    assert group_mean_text("fallback_tags_f1", scalars) == "0.2500"
