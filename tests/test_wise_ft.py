"""wise_ft: the last export of a fine-tune is a weight-space mix of its start and its trained weights (WiSE-FT),
the mixing weight chosen on validation mAP; training itself, resume, EMA, frozen blocks and the time limit are
as without it."""

import json

import numpy as np
import pytest
from train_helpers import head_model, make_project


FINAL, STOPPED, EPOCH1 = "model-resnet_small.keras", "model-resnet_small.stopped.keras", "model-resnet_small.e1.keras"


# --- project.json ---


def test_wise_ft_defaults_to_off_and_reads_a_list_of_mixing_weights(tmp_path):
    from deepdanbooru.project.config import parse_config

    def parse(raw):
        return parse_config(raw, tmp_path, tmp_path / "project.json")

    assert parse({}).wise_ft is None
    assert parse({"wise_ft": None}).wise_ft is None
    assert parse({"wise_ft": [1, 0.5, 0.5, 0]}).wise_ft == (0.0, 0.5, 1.0)


@pytest.mark.parametrize("value, message", [
    ([], "must be a non-empty list of numbers from 0 to 1, or null, got []"),
    (0.5, "must be a non-empty list of numbers from 0 to 1, or null, got 0.5"),
    ([0.5, 1.5], "every number must be from 0 to 1, got [0.5, 1.5]"),
    ([-0.1], "every number must be from 0 to 1, got [-0.1]"),
    (["a"], "must be a number"),
    ([True], "must be a number"),
])
def test_bad_wise_ft_values_are_one_line_naming_the_key(tmp_path, value, message):
    from deepdanbooru.errors import ConfigError
    from deepdanbooru.project.config import parse_config

    with pytest.raises(ConfigError) as error:
        parse_config({"wise_ft": value}, tmp_path, tmp_path / "project.json")
    assert str(error.value).startswith(f"{tmp_path / 'project.json'}: wise_ft: ")
    assert message in str(error.value)


# --- the mix itself ---



def test_the_mix_is_exact_leaves_frozen_layers_alone_and_gives_the_weights_back_bit_for_bit():
    from deepdanbooru.training.wise import StartWeights

    model = head_model(3, "frozen_conv", batch_norm=True)
    start = [w.copy() for w in model.get_weights()]
    frozen = [model.get_layer("frozen_conv")]
    keep = StartWeights(model, [0.25, 1.0], frozen=frozen)
    assert all("frozen_conv" not in w.path for w in keep.weights)
    # Training moves every weight (the frozen layer too, to show the mix leaves it as it is).
    trained = [w + 1.0 + np.arange(w.size, dtype=w.dtype).reshape(w.shape) for w in start]
    model.set_weights(trained)
    with keep.mixed(0.25):
        inside = model.get_weights()
    names = [w.path for w in model.weights]
    for name, s, t, value in zip(names, start, trained, inside):
        expected = t if "frozen_conv" in name else 0.75 * s + 0.25 * t
        np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=name)
    for t, value in zip(trained, model.get_weights()):
        np.testing.assert_array_equal(value, t)
    with keep.mixed(1.0):
        for t, value in zip(trained, model.get_weights()):
            np.testing.assert_array_equal(value, t)


class _Report:
    def __init__(self, value):
        self.result = {"map": value}


def test_the_mix_of_the_best_validation_map_is_chosen_and_a_tie_goes_to_the_more_trained():
    from deepdanbooru.training.wise import StartWeights

    model = head_model(3, "frozen_conv", batch_norm=True)
    keep = StartWeights(model, [0.0, 0.5, 0.8, 1.0])
    model.set_weights([w + 1.0 for w in model.get_weights()])
    head = model.get_layer("head").bias
    # mAP as a function of where the head's bias stands between start (0) and trained (1).
    scores = {0.0: 0.30, 0.5: 0.42, 0.8: 0.42, 1.0: 0.40}
    start_bias = keep.starts[[w.path for w in keep.weights].index(head.path)].numpy()

    def validate():
        alpha = round(float(np.mean(head.numpy() - start_bias)), 3)
        return _Report(scores[alpha])

    alpha, report, tried = keep.choose(validate)
    assert alpha == 0.8 and report.result["map"] == 0.42
    assert tried == scores


def test_the_time_limit_keeps_room_for_the_mixes_of_the_last_export():
    from deepdanbooru.training.budget import TimeBudget

    budget = TimeBudget(1000.0, clock=lambda: 0.0)
    budget.slice_took(10.0)
    budget.checkpoint_took(1.0)
    budget.validation_took(9.0)  # the first validation traces and compiles
    budget.validation_took(4.0)
    plain = budget.needed(1)
    budget.final_validations = 3
    assert budget.needed(1) == pytest.approx(plain + 12.0)  # three at the latest pace
    assert budget.needed(2) == pytest.approx(budget.needed(1) + budget.export_estimate())


# --- in a run ---


@pytest.fixture
def source(tmp_path, sample_dataset):
    """A resnet_small (blocks trainable_blocks can name) that knows the first eight sample tags and one other."""
    from deepdanbooru.models import build_model
    from deepdanbooru.training.export import export_model

    tags = [*sample_dataset[1][:8], "tag_the_project_lacks"]
    path = tmp_path / "source.keras"
    export_model(build_model("resnet_small", (32, 32, 3), len(tags), seed=5), path, tags=tags)
    return path


def start_weights(project, source_path):
    """What the run starts from: the source with its head grown onto tags.txt, as the trainer makes it."""
    from deepdanbooru.models import load_model_file
    from deepdanbooru.training.making import Priors, grow
    from deepdanbooru.training.train import plan_training

    plan = plan_training(project, source_path)
    return grow(load_model_file(source_path), plan, Priors(plan), echo=lambda *_: None, write_report=False)


def by_name(model) -> dict:
    return {w.path: np.asarray(w) for w in model.weights}


def weights_of(path) -> dict:
    import keras

    return by_name(keras.models.load_model(path, compile=False))


WISE = dict(epoch_count=1, validation_fraction=0.5, trainable_blocks=2, checkpoint_frequency_mb=1)


@pytest.mark.slow
def test_the_final_export_mixes_the_start_with_the_averaged_weights_at_the_best_validation_map(
        tmp_path, sample_dataset, source):
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, **WISE, ema_decay=0.5, wise_ft=[0.0, 0.5, 1.0])
    lines = []
    train_project(project, source_model=source, echo=lines.append)
    metrics = json.loads((project / "model-resnet_small.metrics.json").read_text())
    chosen = metrics["wise_ft"]
    alpha = chosen["alpha"]
    assert chosen["metric"] == "map" and set(chosen["tried"]) == {"0", "0.5", "1"}
    assert chosen["tried"][f"{alpha:g}"] == max(chosen["tried"].values()) == pytest.approx(metrics["metrics"]["map"])
    held = "the trained weights (a = 1)" if alpha == 1 else f"{1 - alpha:g} x the start + {alpha:g} x the trained weights"
    assert any(line.startswith(f"wise_ft: {FINAL} holds {held}, the best validation mAP of the mixes tried (0: ")
               for line in lines)
    history = [row for row in read_history(project / "logs" / "history.jsonl") if row.get("kind") == "validation"]
    assert history[-1]["trigger"] == "wise_ft" and history[-1]["map"] == pytest.approx(metrics["metrics"]["map"])

    # The epoch export of the same step holds the moving average (ema_decay), unmixed; the final one the mix of it.
    start, averaged, final = by_name(start_weights(project, source)), weights_of(project / EPOCH1), \
        weights_of(project / FINAL)
    moved = 0
    for name, value in final.items():
        np.testing.assert_allclose(value, (1 - alpha) * start[name] + alpha * averaged[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        if not np.allclose(start[name], averaged[name]):
            moved += 1
            assert not name.startswith(("stage1", "stage2")), name  # trainable_blocks 2: frozen stay the source's
    assert moved


@pytest.mark.slow
def test_a_stopped_and_resumed_run_trains_as_without_wise_ft_and_mixes_with_its_recorded_start(
        tmp_path, sample_dataset, source):
    from deepdanbooru.training.train import train_project

    plain = make_project(tmp_path / "plain", *sample_dataset, **WISE)
    wise = make_project(tmp_path / "wise", *sample_dataset, **WISE, wise_ft=[0.0])
    for project in (plain, wise):
        train_project(project, source_model=source, echo=lambda *_: None, time_limit=1e-3)  # one slice, then stop
    start = by_name(start_weights(wise, source))
    for name, value in weights_of(wise / STOPPED).items():  # the stop's export is the mix too: here the start
        np.testing.assert_allclose(value, start[name], rtol=1e-6, atol=1e-7, err_msg=name)

    # Resumed without --source-model: the start comes from the checkpoint; training went on from trained weights.
    for project in (plain, wise):
        train_project(project, echo=lambda *_: None)
    plain_weights, wise_epoch = weights_of(plain / EPOCH1), weights_of(wise / EPOCH1)
    for name, value in plain_weights.items():
        np.testing.assert_array_equal(wise_epoch[name], value, err_msg=name)
    for name, value in weights_of(wise / FINAL).items():
        np.testing.assert_allclose(value, start[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert "wise_ft" not in json.loads((plain / "model-resnet_small.metrics.json").read_text())


@pytest.mark.slow
def test_without_a_source_wise_ft_says_there_is_nothing_to_mix(tmp_path, sample_dataset):
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, validation_fraction=0.5,
                           wise_ft=[0.5, 1.0])
    lines = []
    train_project(project, echo=lines.append)
    assert f"notice: wise_ft in {project / 'project.json'} mixes with a --source-model's weights; this run starts " \
           "from no source, so its exports hold the trained weights" in lines
    assert "wise_ft" not in json.loads((project / "model-resnet_small.metrics.json").read_text())
    assert not any(line.startswith("wise_ft:") for line in lines)


@pytest.mark.slow
def test_without_validation_wise_ft_says_it_has_nothing_to_choose_on(tmp_path, sample_dataset, source):
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=1, validation_fraction=0.0,
                           trainable_blocks=2, wise_ft=[0.5, 1.0])
    lines = []
    train_project(project, source_model=source, echo=lines.append)
    assert f"notice: wise_ft in {project / 'project.json'} chooses its mix on the validation split, and this run " \
           "has none (validation_fraction 0): its exports hold the trained weights" in lines
    assert not any(line.startswith("wise_ft:") for line in lines)
    assert (project / FINAL).is_file()
