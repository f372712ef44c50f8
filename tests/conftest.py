"""Shared fixtures: a small generated dataset and a project that trains on it."""

import json
from pathlib import Path

import pytest

from deepdanbooru import hardware
from deepdanbooru.sample.generator import generate_sample_dataset


@pytest.fixture(autouse=True)
def no_gpu_in_the_driver(monkeypatch):
    """Tests see a machine without a GPU (create-project's mixed_precision, the unused-GPU note) wherever
    they run; tests of the probe give it a GPU explicitly."""
    monkeypatch.setattr(hardware, "find_gpus", lambda *args, **kwargs: [])


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory):
    """(database path, tags) of 24 posts of 32x32 JPEGs. Shared: tests must not modify it."""
    directory = tmp_path_factory.mktemp("sample_dataset")
    return generate_sample_dataset(directory, count=24, size=32)


@pytest.fixture
def sample_project(tmp_path, sample_dataset):
    """A fresh project directory (resnet_small, 32x32) pointing at the shared sample dataset."""
    database, tags = sample_dataset
    project = tmp_path / "project"
    project.mkdir()
    config = {
        "image_width": 32,
        "image_height": 32,
        "database_path": str(database),
        "minimum_tag_count": 1,
        "model": "resnet_small",
        "minibatch_size": 4,
        "epoch_count": 1,
    }
    (project / "project.json").write_text(json.dumps(config, indent=4) + "\n")
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    return project


@pytest.fixture
def exported_project(tmp_path):
    """make(model_file, size, tags, **keys): tmp_path/project, whose final resnet_small export is model_file."""
    def make(model_file, size, tags, **keys):
        project = tmp_path / "project"
        project.mkdir()
        settings = {"image_width": size, "image_height": size, "model": "resnet_small", **keys}
        (project / "project.json").write_text(json.dumps(settings))
        (project / "tags.txt").write_text("".join(f"{tag}\n" for tag in tags))
        (project / "model-resnet_small.keras").write_bytes(Path(model_file).read_bytes())
        return project
    return make
