"""source_distillation: a fine-tune also learns the start's scores on the tags the source knows (learning without
forgetting); its teacher is the start, kept in the checkpoint with the known tags, so a resumed run distils the same."""

import numpy as np
import pytest
from test_wise_ft import by_name, source, start_weights, weights_of  # noqa: F401  (source: a fixture)
from train_helpers import head_model, make_project

from deepdanbooru.errors import TrainingError


def test_source_distillation_defaults_to_off_and_takes_a_positive_weight(tmp_path):
    from deepdanbooru.errors import ConfigError
    from deepdanbooru.project.config import parse_config

    def parse(raw):
        return parse_config(raw, tmp_path, tmp_path / "project.json")

    assert parse({}).source_distillation is None
    assert parse({"source_distillation": 0.5}).source_distillation == 0.5
    for bad in (0, -1, "a", [1]):
        with pytest.raises(ConfigError, match=r"project.json: source_distillation: "):
            parse({"source_distillation": bad})



def test_the_term_is_the_bce_to_the_starts_scores_on_the_known_tags_and_pulls_only_where_they_differ():
    import tensorflow as tf

    from deepdanbooru.training.distill import Distillation
    from deepdanbooru.training.wise import StartWeights

    model = head_model(4, "frozen_conv")
    distill = Distillation(model, 2.0, known=[0, 2], start=StartWeights(model, ()))
    distill.load()
    teacher = tf.constant([[0.9, 0.2, 0.1], [0.3, 0.6, 0.5]])
    student = tf.Variable([[0.6, 0.7, 0.1], [0.3, 0.1, 0.8]])
    with tf.GradientTape() as tape:
        term = distill.per_example(teacher, student)
    t, s = teacher.numpy(), student.numpy()
    cross = -(t * np.log(s) + (1 - t) * np.log(1 - s)) * np.array([1.0, 0.0, 1.0])
    np.testing.assert_allclose(term.numpy(), 2.0 * cross.mean(axis=1), rtol=1e-6)
    gradient = tape.gradient(term, student).numpy()
    assert gradient[:, 1].tolist() == [0.0, 0.0]  # a new tag learns from its labels alone
    assert gradient[0, 2] == pytest.approx(0.0, abs=1e-6) and gradient[1, 0] == pytest.approx(0.0, abs=1e-6)  # agree
    assert gradient[0, 0] < 0 < gradient[1, 2]  # pulled toward the start's score


def test_the_teacher_holds_the_start_and_the_frozen_layers_as_the_model_has_them():
    from deepdanbooru.training.distill import Distillation
    from deepdanbooru.training.wise import StartWeights

    model = head_model(4, "frozen_conv")
    before = by_name(model)
    start = StartWeights(model, (), frozen=[model.get_layer("frozen_conv")])
    distill = Distillation(model, 1.0, known=[0], start=start)
    model.set_weights([w + 1.0 for w in model.get_weights()])  # trained (the frozen layer too, to tell them apart)
    distill.load()
    teacher = by_name(distill.teacher)
    now = by_name(model)
    for name, value in teacher.items():
        np.testing.assert_array_equal(value, now[name] if "frozen_conv" in name else before[name], err_msg=name)


FAST = dict(epoch_count=1, validation_fraction=0.5, trainable_blocks=2, checkpoint_frequency_mb=1,
            export_model_per_epoch=1)


def test_a_checkpoint_written_without_the_key_is_refused_in_one_line(tmp_path):
    """The start (and for source_distillation the known tags) must be in the checkpoint a run resumes."""
    import tensorflow as tf

    from deepdanbooru.project.config import parse_config
    from deepdanbooru.training.wise import check_resumable

    plain = tf.train.Checkpoint(x=tf.Variable(1.0)).write(str(tmp_path / "plain"))
    wise_only = tf.train.Checkpoint(x=tf.Variable(1.0), start_weights=tf.Module())
    wise_only.start_weights.v = tf.Variable([1.0])
    wise = wise_only.write(str(tmp_path / "wise"))
    both = tf.train.Checkpoint(x=tf.Variable(1.0), start_weights=wise_only.start_weights,
                               source_distillation=tf.Module())
    both.source_distillation.known = tf.Variable([1.0])
    both = both.write(str(tmp_path / "both"))

    def config(**raw):
        return parse_config(raw, tmp_path, tmp_path / "project.json")

    check_resumable(None, config(source_distillation=1.0))  # a fresh run
    check_resumable(plain, config())
    check_resumable(wise, config(wise_ft=[0.5, 1]))
    check_resumable(both, config(wise_ft=[1], source_distillation=1.0))
    for latest, raw, key in ((plain, {"wise_ft": [1]}, "wise_ft"), (plain, {"source_distillation": 1.0},
                             "source_distillation"), (wise, {"source_distillation": 1.0}, "source_distillation")):
        with pytest.raises(TrainingError) as error:
            check_resumable(latest, config(**raw))
        assert str(error.value) == (
            f"{tmp_path / 'project.json'}: {key}: {latest} was written without {key}, so it does not hold what "
            f"the run started from; set {key} back to null to resume it, or start the run again (delete the "
            "checkpoints folder) to use it")


FAST = dict(epoch_count=1, validation_fraction=0.5, trainable_blocks=2, checkpoint_frequency_mb=1,
            export_model_per_epoch=1, ema_decay=0.5)


@pytest.mark.slow
def test_a_distilled_run_stopped_and_resumed_ends_as_one_that_never_stopped(tmp_path, sample_dataset, source):  # noqa: F811
    from deepdanbooru.training.train import train_project

    reference = make_project(tmp_path / "reference", *sample_dataset, **FAST, source_distillation=5.0)
    train_project(reference, source_model=source, echo=lambda *_: None)
    chained = make_project(tmp_path / "chained", *sample_dataset, **FAST, source_distillation=5.0)
    train_project(chained, source_model=source, echo=lambda *_: None, time_limit=1e-3)  # one slice, then stop
    # The term moves the weights: the same slice without it ends elsewhere.
    plain = make_project(tmp_path / "plain", *sample_dataset, **FAST)
    train_project(plain, source_model=source, echo=lambda *_: None, time_limit=1e-3)
    stopped = "model-resnet_small.stopped.keras"
    distilled, undistilled = weights_of(chained / stopped), weights_of(plain / stopped)
    assert any(not np.allclose(undistilled[name], value) for name, value in distilled.items())

    train_project(chained, echo=lambda *_: None)  # resumed without --source-model: the teacher from the checkpoint
    final = "model-resnet_small.keras"
    expected, got = weights_of(reference / final), weights_of(chained / final)
    start = by_name(start_weights(reference, source))
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
        if name.startswith(("stage1", "stage2")):  # trainable_blocks 2: the first stages stay the source's
            np.testing.assert_array_equal(value, start[name], err_msg=name)


@pytest.mark.slow
def test_both_keys_meet_freeze_backbone_epochs(tmp_path, sample_dataset, source):  # noqa: F811
    """The trunk frozen for the first epoch, then trained with the distillation term; the final export is the
    start (wise_ft [0]) whatever the trunk did."""
    from deepdanbooru.training.train import train_project

    project = make_project(tmp_path / "p", *sample_dataset, epoch_count=2, validation_fraction=0.5,
                           checkpoint_frequency_mb=3, freeze_backbone_epochs=1, source_distillation=1.0,
                           wise_ft=[0.0])
    lines = []
    train_project(project, source_model=source, echo=lines.append)
    start = by_name(start_weights(project, source))
    first, second = weights_of(project / "model-resnet_small.e1.keras"), weights_of(project / "model-resnet_small.e2.keras")
    trunk = [name for name in start if not name.startswith(("predictions", "head", "dense"))
             and "moving" not in name and start[name].ndim == 4]
    assert trunk
    for name in trunk:
        np.testing.assert_array_equal(first[name], start[name], err_msg=name)  # frozen in epoch 1
    assert any(not np.array_equal(second[name], start[name]) for name in trunk)  # trained in epoch 2
    for name, value in weights_of(project / "model-resnet_small.keras").items():
        np.testing.assert_allclose(value, start[name], rtol=1e-6, atol=1e-7, err_msg=name)
