"""Which of a project's exports evaluate, evaluate-project and export-bundle use: the best export when its
validation beats the one they would otherwise take (a --time-limit stop's, the final one), saying so."""

import json

import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.inference.onnx_graph import onnx_available
from deepdanbooru.inference.model_files import resolve_model_files, resolve_model_source

MODEL = "resnet_small"


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def tiny_model(n_tags):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)  # grad-cam needs a convolution
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(n_tags, activation="sigmoid")(x))


def write_export(project, name, model_bytes, metrics=None):
    (project / name).write_bytes(model_bytes)
    if metrics is not None:
        stem = name.removesuffix(".keras")
        (project / f"{stem}.metrics.json").write_text(json.dumps({"model": name, "metrics": metrics}))


def write_best(project, model_bytes, value, step=120, metric="macro_f1"):
    write_export(project, f"model-{MODEL}.best.keras", model_bytes, {metric: value})
    (project / f"model-{MODEL}.best.json").write_text(json.dumps(
        {"model": f"model-{MODEL}.best.keras", "metric": metric, "value": value, "used_minibatch": step}))


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory, sample_dataset):
    path = tmp_path_factory.mktemp("choice") / "m.keras"
    tiny_model(len(sample_dataset[1])).save(path)
    return path.read_bytes()


@pytest.fixture
def project(tmp_path, sample_dataset, model_bytes):
    """A project stopped by --time-limit (macro-F1 0.0987) whose best export scored 0.1050."""
    database, tags = sample_dataset
    project = tmp_path / "project"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({
        "image_width": 32, "image_height": 32, "database_path": str(database), "minimum_tag_count": 1,
        "model": MODEL, "validation_fraction": 0.25}))
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    write_export(project, f"model-{MODEL}.stopped.keras", model_bytes, {"macro_f1": 0.0987})
    write_best(project, model_bytes, 0.1050)
    return project


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "red.png"
    Image.new("RGB", (40, 24), (255, 0, 0)).save(path)
    return path


def best_line(project):
    return (f"Model: {project / f'model-{MODEL}.best.keras'} (the project's best model by macro_f1: 0.1050 on "
            f"validation at step 120, better than 0.0987 of model-{MODEL}.stopped.keras, the export of a "
            "--time-limit stop: training is not complete; --model-path takes another)")


@pytest.mark.slow
def test_evaluate_and_evaluate_project_take_the_best_export_over_the_stopped_one(project, image):
    for command in (["evaluate", image, "--project-path", project], ["evaluate-project", project, image]):
        result = run_cli(*command)
        assert result.exit_code == 0, result.output
        assert result.stderr.splitlines()[0].startswith(best_line(project) + "; thresholds: ")


def test_grad_cam_and_conv2tflite_take_the_best_export_too(project, image, tmp_path):
    result = run_cli("grad-cam", project, image, "--save-path", tmp_path / "maps")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == best_line(project)
    assert resolve_model_source(project) == (project / f"model-{MODEL}.best.keras",
                                             best_line(project).split(" (", 1)[1][:-1])


@pytest.mark.slow
def test_evaluate_project_metrics_takes_the_best_export(project):
    result = run_cli("evaluate-project", project, "--metrics")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == best_line(project)
    result = run_cli("evaluate-project", project, "--metrics", "--format", "json")
    assert json.loads(result.stdout)["model"] == str(project / f"model-{MODEL}.best.keras")


@pytest.mark.skipif(not onnx_available(), reason="export-bundle needs tf2onnx and onnxruntime (pip install '.[test]')")
def test_export_bundle_takes_the_best_export(project, tmp_path):
    result = run_cli("export-bundle", project, tmp_path / "bundle", "--size", 32)
    assert result.exit_code == 0, result.output
    assert best_line(project) in result.stdout.splitlines()
    metrics = json.loads((tmp_path / "bundle" / "metrics.json").read_text())
    assert metrics["model"] == str(project / f"model-{MODEL}.best.keras")


def test_an_explicit_model_path_still_wins(project, image):
    stopped = project / f"model-{MODEL}.stopped.keras"
    result = run_cli("evaluate", image, "--project-path", project, "--model-path", stopped)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"Model: {stopped} (the file given with --model-path)")


def test_the_best_export_is_taken_only_when_its_validation_is_better(project, model_bytes):
    stopped = project / f"model-{MODEL}.stopped.keras"
    final = project / f"model-{MODEL}.keras"
    best = project / f"model-{MODEL}.best.keras"
    write_best(project, model_bytes, 0.0987)  # a tie: the export it would take anyway
    assert resolve_model_files(project).model == stopped
    write_best(project, model_bytes, 0.0500, metric="loss")  # lower is better for the loss
    (project / f"model-{MODEL}.stopped.metrics.json").write_text(json.dumps({"metrics": {"loss": 0.07}}))
    assert resolve_model_files(project).kind.startswith("the project's best model by loss: 0.0500")
    write_export(project, final.name, model_bytes, {"loss": 0.06})  # a finished run: the final export ...
    files = resolve_model_files(project)
    assert files.model == best and ", better than 0.0600 of model-resnet_small.keras, the project's final " \
                                   "export;" in files.kind
    write_export(project, final.name, model_bytes, {"loss": 0.04})  # ... unless it scored better
    assert resolve_model_files(project).model == final
    (project / f"model-{MODEL}.metrics.json").unlink()  # no figures to compare: the best may be older
    assert resolve_model_files(project).model == final
    final.unlink()
    stopped.unlink()
    (project / f"model-{MODEL}.stopped.metrics.json").unlink()
    files = resolve_model_files(project)
    assert files.model == best and files.kind.endswith("; there is no final export")
    (project / f"model-{MODEL}.best.json").unlink()  # a best export without its record is not chosen
    with pytest.raises(Exception, match="no exported model"):
        resolve_model_files(project)
