"""preflight --source-model: a file train-project cannot open as a Keras model fails the model check, as the run
would, instead of passing it by a name it could not read."""

import zipfile

import pytest

from deepdanbooru.preflight.main import training_preflight


def model_line(project, source):
    results = training_preflight(str(project), max_image_checks=2, source_model=str(source))
    return next(result for result in results if result.name == "model")


@pytest.mark.parametrize("content, said", [
    (b"junk\n", "it is not a whole zip archive (5 bytes: cut short, or another kind of file)"),
    (b"", "it is empty (0 bytes)"),
    (None, "it holds no config.json"),
])
def test_a_source_model_that_is_no_keras_archive_fails_the_model_check(sample_project, tmp_path, content, said):
    source = tmp_path / "source.keras"
    if content is None:
        with zipfile.ZipFile(source, "w") as archive:
            archive.writestr("notes.txt", "not a model")
    else:
        source.write_bytes(content)
    result = model_line(sample_project, source)
    assert result.status == "FAIL"
    assert result.detail.startswith(f"{source}: cannot be opened as a Keras model: ") and said in result.detail


def test_a_keras_archive_with_its_config_passes_by_its_name(sample_project, tmp_path):
    source = tmp_path / "source.keras"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("config.json", '{"class_name": "Functional", "config": {"name": "my_net"}}')
    result = model_line(sample_project, source)
    assert result.status == "PASS" and result.detail.startswith("my_net (the network of --source-model")


def test_train_project_s_loader_says_the_same_of_a_zip_without_config(tmp_path):
    from deepdanbooru.errors import ModelError
    from deepdanbooru.models.files import load_model_file

    source = tmp_path / "source.keras"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("notes.txt", "not a model")
    with pytest.raises(ModelError) as caught:
        load_model_file(source)
    assert str(caught.value) == (f"{source}: cannot be opened as a Keras model: it holds no config.json (a zip "
                                 "archive, but not a model Keras saved); a .keras model is a zip archive as Keras "
                                 "saves it")
