"""The vocabulary inside every export: written with the model, read before TensorFlow starts."""

import keras
import pytest

from deepdanbooru.models.vocabulary import read_model_tags
from deepdanbooru.training.export import export_model
from deepdanbooru.training.source import source_model_tags


def _model(units):
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Activation("sigmoid")(keras.layers.Dense(units)(inputs)))


def test_exports_record_their_tags_and_stay_plain_keras_files(tmp_path):
    model = _model(3)
    tags = ["1girl", "long_hair", "smile"]
    path, copy = tmp_path / "model-x.keras", tmp_path / "model-x.float32.keras"
    export_model(model, path, float32_copy=copy, tags=tags)
    assert read_model_tags(path) == read_model_tags(copy) == tuple(tags)
    assert keras.models.load_model(path).output_shape == (None, 3)
    # The record wins over a stale sidecar; --source-tags wins over both.
    (tmp_path / "model-x.thresholds.csv").write_text("tag,threshold\nother,0.5\n")
    assert source_model_tags(path) == tuple(tags)
    (tmp_path / "given.txt").write_text("a\nb\nc\n")
    assert source_model_tags(path, tmp_path / "given.txt") == ("a", "b", "c")
    with pytest.raises(ValueError, match="2 tags for a model of 3 outputs"):
        export_model(model, tmp_path / "wrong.keras", tags=tags[:2])


def test_a_file_without_the_record_falls_back_to_the_sidecar(tmp_path):
    path = tmp_path / "plain.keras"
    _model(2).save(path)  # written by plain Keras: no record
    assert read_model_tags(path) is None and read_model_tags(tmp_path / "x.h5") is None
    assert source_model_tags(path) is None
    (tmp_path / "plain.thresholds.csv").write_text("tag,threshold\na,0.5\nb,0.4\n")
    assert source_model_tags(path) == ("a", "b")
