"""Multi-hot labels from tag strings, in-graph, against a Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from deepdanbooru.pipeline import (  # noqa: E402
    Augmentation, TrainingInput, inference_dataset, multi_hot, tag_table, training_dataset,
)

TAGS = ["1girl", "solo", "long_hair", "rating:general", "smile", "c++", "tag.with.dots"]


def _reference(tag_string, tags=TAGS):
    row = np.zeros(len(tags), np.float32)
    for token in tag_string.split():
        if token in tags:
            row[tags.index(token)] = 1.0
    return row


CASES = [
    "1girl solo smile",
    "",
    "   ",
    "solo   long_hair\tsmile\n",  # any whitespace run separates
    "unknown_tag another_unknown",
    "smile smile smile solo",  # repeats count once
    "rating:general c++ tag.with.dots",  # punctuation is part of the tag
    " 1girl",
    "1girl_extra solo_",  # prefixes of known tags are not known tags
    "SOLO Smile",  # case matters, as in tags.txt
]


def test_multi_hot_matches_python_reference_on_crafted_strings():
    table = tag_table(TAGS)
    labels = multi_hot(tf.constant(CASES), table, len(TAGS)).numpy()
    assert labels.dtype == np.float32 and labels.shape == (len(CASES), len(TAGS))
    np.testing.assert_array_equal(labels, np.stack([_reference(case) for case in CASES]))


def test_multi_hot_on_a_batch_of_only_empty_strings_is_all_zero():
    labels = multi_hot(tf.constant(["", " "]), tag_table(TAGS), len(TAGS)).numpy()
    np.testing.assert_array_equal(labels, np.zeros((2, len(TAGS)), np.float32))


def test_multi_hot_with_a_large_vocabulary_is_exact():
    rng = np.random.default_rng(0)
    tags = [f"tag_{i}" for i in range(5000)]
    strings = [" ".join(rng.choice(tags + ["unknown"], size=int(rng.integers(0, 60)))) for _ in range(64)]
    labels = multi_hot(tf.constant(strings), tag_table(tags), len(tags)).numpy()
    index = {tag: i for i, tag in enumerate(tags)}
    for row, string in zip(labels, strings):
        expected = np.zeros(len(tags), np.float32)
        expected[[index[t] for t in string.split() if t in index]] = 1.0
        np.testing.assert_array_equal(row, expected)


def test_datasets_attach_labels_in_record_order(tmp_path):
    paths = []
    for i in range(5):
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(path)
        paths.append(str(path))
    strings = CASES[:5]
    train = list(training_dataset(paths, strings, TAGS,
                                  TrainingInput(16, 16, Augmentation((0, 360), (0.9, 1.1), (-0.1, 0.1)),
                                                seed=0, batch_size=2, max_image_pixels=10**6),
                                  random_seed=0, start_position=10))
    assert [b["label"].shape[0] for b in train] == [2, 2, 1]
    assert train[0]["label"].shape[1:] == (len(TAGS),)  # static width for Keras losses
    labels = np.concatenate([b["label"].numpy() for b in train])
    np.testing.assert_array_equal(labels, np.stack([_reference(s) for s in strings]))
    inference = list(inference_dataset(paths, height=16, width=16, batch_size=8, max_image_pixels=10**6,
                                       tag_strings=strings, tags=TAGS))
    np.testing.assert_array_equal(inference[0]["label"].numpy(), labels)
    unlabelled = next(iter(inference_dataset(paths, height=16, width=16, batch_size=8, max_image_pixels=10**6)))
    assert set(unlabelled) == {"image", "position"}
