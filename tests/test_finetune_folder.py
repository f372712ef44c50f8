"""train-project --source-model FOLDER: a timm checkpoint (WD-like fixture, 32x32) mapped onto a project by name."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from train_helpers import make_project, set_config

from deepdanbooru.cli import main
from deepdanbooru.project.categories import parse_categories

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "timm" / "vit_wd"
# The fixture's seven rows renamed so that three meet the sample vocabulary under other spellings.
SELECTED = """tag_id,name,category,count
1000,general,9,500
1001,sensitive,9,499
1002,questionable,9,498
1003,explicit,9,497
1004,grey background,0,496
1005,Red,0,495
1006,hatsune_miku,4,494
"""


@pytest.fixture
def folder(tmp_path):
    copy = tmp_path / "wd-tagger"
    shutil.copytree(FIXTURE, copy)
    (copy / "selected_tags.csv").write_text(SELECTED)
    return copy


@pytest.fixture
def project(tmp_path, sample_dataset):
    database, tags = sample_dataset
    return make_project(tmp_path / "p", database, [*tags, "rating:general"])


def test_folder_source_maps_by_name_starts_new_tags_at_the_prior_and_carries_categories(folder, project):
    import keras

    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.training.making import Priors, make_model
    from deepdanbooru.training.train import plan_training

    plan = plan_training(project, folder)
    lines = []
    model = make_model(plan, "float32", Priors(plan), resuming=False, echo=lines.append)
    report = project / "logs" / "vocabulary.txt"
    assert any(line.startswith("--source-model wd-tagger: vit_base_patch16_224-depth2-dim32-heads4-patch8-img32; "
                               "channel order the weights expect: bgr") for line in lines)
    assert f"--source-model wd-tagger: kept 3 tags, 15 new, 4 dropped (listed in {report})" in "\n".join(lines)
    rows = report.read_text().splitlines()[1:]
    assert "kept\tgrey_background" in rows and "kept\tred\tRed" in rows and "kept\trating:general" in rows
    assert "new\tcircle" in rows
    assert rows[-4:] == ["dropped\trating:sensitive", "dropped\trating:questionable", "dropped\trating:explicit",
                         "dropped\thatsune_miku"]

    tags = plan.tags
    categories = parse_categories((project / "categories.json").read_text(), "categories.json", len(tags))
    assert categories[tags.index("rating:general")] == 9 and categories.count(9) == 1
    assert set(categories) == {0, 9}

    pictures = np.random.default_rng(0).random((2, 32, 32, 3)).astype(np.float32)
    scores = keras.ops.convert_to_numpy(model(pictures))
    source = keras.ops.convert_to_numpy(import_checkpoint(folder).model(pictures))
    # Kept rows answer as the source's (fixture rows 0, 4, 5); a new row is its prior for every picture.
    for tag, row in (("rating:general", 0), ("grey_background", 4), ("red", 5)):
        np.testing.assert_allclose(scores[:, tags.index(tag)], source[:, row], atol=1e-5)
    prior = 1.0 / (1.0 + np.exp(-np.array(Priors(plan).log_odds())))
    new = [index for index, tag in enumerate(tags) if tag not in ("rating:general", "grey_background", "red")]
    np.testing.assert_allclose(scores[:, new], np.broadcast_to(prior[new], (2, len(new))), atol=1e-5)


def test_a_users_categories_json_is_kept(folder, project):
    from deepdanbooru.training.source import carry_categories
    from deepdanbooru.training.train import plan_training

    red = (project / "tags.txt").read_text().split().index("red")
    mine = json.dumps([{"name": "general", "start_index": 0}, {"name": "character", "start_index": red},
                       {"name": "general", "start_index": red + 1}]) + "\n"
    (project / "categories.json").write_text(mine)
    lines = []
    carry_categories(plan_training(project, folder), lines.append)
    assert (project / "categories.json").read_text() == mine
    assert lines == [f"notice: {project / 'categories.json'} gives 1 tag(s) another category than --source-model "
                     "wd-tagger (e.g. red); categories.json is kept as it is"]


def _one_line_error(*args) -> str:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output.strip()


def test_wrong_size_and_bad_folder_are_one_line_and_leave_the_project_alone(folder, project):
    set_config(project, image_width=48)
    before = sorted(p.name for p in project.iterdir())
    message = _one_line_error("train-project", project, "--source-model", folder)
    assert message == (f"error: {project / 'project.json'}: image_width/image_height: 48x32, but --source-model "
                       f"{folder} takes 32x32 (pretrained_cfg.input_size of its config.json); set image_width 32 "
                       "and image_height 32 (or set resample_positions true to resample the checkpoint's position table)")
    set_config(project, image_width=32)
    (folder / "model.safetensors").unlink()
    message = _one_line_error("train-project", project, "--source-model", folder)
    assert message.startswith(f"error: {folder / 'model.safetensors'}: not found")
    assert sorted(p.name for p in project.iterdir()) == before


def test_resample_positions_starts_a_vit_at_another_size(folder, project):
    import keras

    from deepdanbooru.models.timm.checkpoint import import_checkpoint
    from deepdanbooru.training.making import Priors, make_model
    from deepdanbooru.training.train import plan_training

    set_config(project, image_width=48, image_height=64, resample_positions=True)
    plan = plan_training(project, folder)
    lines = []
    model = make_model(plan, "float32", Priors(plan), resuming=False, echo=lines.append)
    assert model.input_shape == (None, 64, 48, 3)
    assert "--source-model wd-tagger: position table resampled from 32x32 to 48x64 (resample_positions)" in lines
    table = model.get_layer("vit_position_embedding").get_weights()[0].reshape(-1, 32)
    original = import_checkpoint(folder).model.get_layer("vit_position_embedding").get_weights()[0].reshape(-1, 32)
    # 8x8 patches: a 4x4 grid of 32 features (no class token in this fixture) onto 8x6.
    assert original.shape == (16, 32) and table.shape == (48, 32)
    assert np.isclose(table.mean(), original.mean(), atol=0.05) and not np.allclose(table[:16], original)
    scores = keras.ops.convert_to_numpy(model(np.zeros((1, 64, 48, 3), np.float32)))
    assert scores.shape == (1, len(plan.tags)) and np.isfinite(scores).all()


@pytest.mark.slow
def test_fine_tune_from_the_folder_trains_and_exports_its_tags(folder, project):
    from deepdanbooru.models.vocabulary import read_model_tags

    set_config(project, epoch_count=1, minibatch_size=8)
    result = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(folder)])
    assert result.exit_code == 0, result.output
    export = next(project.glob("model-*.keras"))
    assert list(read_model_tags(export)) == (project / "tags.txt").read_text().split()


def test_a_checkpoint_refused_at_import_leaves_the_project_alone(folder, project):
    # config.json asks for a third block the weights do not have: found only when the weights are read, after
    # the run has started; the categories the folder carries must not have been written by then.
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["depth"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    before = sorted(str(p.relative_to(project)) for p in project.rglob("*"))
    result = CliRunner().invoke(main, ["train-project", str(project), "--source-model", str(folder)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines()[-1].startswith(
        f"error: {folder / 'model.safetensors'}: missing 12 tensor(s) the architecture needs")
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*")) == before


def test_resample_positions_starts_an_eva02_at_another_size(tmp_path, project):
    from deepdanbooru.training.making import Priors, make_model
    from deepdanbooru.training.train import plan_training

    folder = Path(shutil.copytree(FIXTURE.parent / "eva02_wd", tmp_path / "wd-eva02"))
    (folder / "selected_tags.csv").write_text(SELECTED)
    set_config(project, image_width=48, image_height=40)
    message = _one_line_error("train-project", project, "--source-model", folder)
    assert message.endswith("(or set resample_positions true to resample the checkpoint's position table)")
    set_config(project, resample_positions=True)
    plan = plan_training(project, folder)
    lines = []
    model = make_model(plan, "float32", Priors(plan), resuming=False, echo=lines.append)
    assert model.input_shape == (None, 40, 48, 3)
    assert "--source-model wd-eva02: position table resampled from 32x32 to 48x40 (resample_positions)" in lines
    # The rotary tables are the new 5x6 grid's: one row per class token and patch.
    assert model.get_layer("vit_rope_sin").get_weights()[0].size == (1 + 5 * 6) * 8
    assert np.isfinite(np.asarray(model(np.zeros((1, 40, 48, 3), np.float32)))).all()
