"""bench/caption_f1.py's figures: per-picture F1 against the known tags, and the tags landing on most pictures."""


import pytest

from bench_modules import load_bench


def load():
    return load_bench("caption_f1")


def test_per_picture_f1_counts_only_the_vocabulary_and_names_tags_on_most_pictures():
    figures = load().figures
    truth = {"a.png": {"cat", "red", "not_in_vocabulary"}, "b.png": {"dog"}, "c.png": set(), "d.png": {"cat"}}
    printed = {"a.png": {"cat", "blue"}, "b.png": {"blue"}, "c.png": set(), "d.png": {"cat", "blue"}}
    result = figures(truth, printed, {"cat", "red", "dog", "blue"})
    # a: known {cat, red}, printed {cat, blue}: 2*1/4; b: 0; c: neither, 1; d: 2*1/3.
    assert result["mean_picture_f1"] == pytest.approx((0.5 + 0.0 + 1.0 + 2 / 3) / 4)
    assert result["micro_precision"] == pytest.approx(2 / 5) and result["micro_recall"] == pytest.approx(2 / 4)
    assert result["tags_per_picture"] == pytest.approx(5 / 4)
    # blue lands on 3 of 4 pictures and no picture carries it; cat on 2 of 4 is not over half.
    assert result["over_half"] == [("blue", 0.75, 0.0)]
