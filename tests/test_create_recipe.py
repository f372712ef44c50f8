"""create-project --recipe: the recipe's values over the defaults, checked before anything is written."""

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.errors import ConfigError
from deepdanbooru.project import recipes
from deepdanbooru.project.config import default_project_json, load_config, parse_config
from deepdanbooru.project.create import create_project


def test_default_recipe_is_deepdanbooru_defaults(tmp_path):
    assert recipes.DEFAULT_RECIPE == "deepdanbooru" and recipes.RECIPES["deepdanbooru"] == {}
    result = CliRunner().invoke(main, ["create-project", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p" / "project.json").read_text()) == default_project_json()


def test_a_recipe_lays_its_values_over_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setitem(recipes.RECIPES, "tiny", {"model": "resnet_small", "learning_rate": 0.01,
                                                  "gradient_clip_norm": 1.0})
    lines = []
    create_project(tmp_path / "p", recipe="tiny", echo=lines.append)
    written = json.loads((tmp_path / "p" / "project.json").read_text())
    assert written == {**default_project_json(), "model": "resnet_small", "learning_rate": 0.01,
                       "gradient_clip_norm": 1.0}
    config = load_config(tmp_path / "p")
    assert (config.model, config.learning_rate, config.gradient_clip_norm) == ("resnet_small", 0.01, 1.0)
    assert lines[0].endswith("(recipe tiny)")


@pytest.mark.parametrize("values, message", [
    ({"horizontal_flop": True}, "--recipe broken: horizontal_flop: unknown key; did you mean 'horizontal_flip'"),
    ({"sharpness_boost": True}, "--recipe broken: unknown key 'sharpness_boost'"),
    ({"model": "resnet_huge"}, "--recipe broken: model: must be one of"),
])
def test_a_recipe_this_version_cannot_use_is_refused_and_nothing_written(tmp_path, monkeypatch, values, message):
    monkeypatch.setitem(recipes.RECIPES, "broken", values)
    with pytest.raises(ConfigError, match=message):
        create_project(tmp_path / "p", recipe="broken")
    assert not (tmp_path / "p").exists()
    with pytest.raises(ConfigError, match="--recipe: must be one of"):
        create_project(tmp_path / "p", recipe="nope")


def test_cli_offers_the_table_and_refuses_other_names(tmp_path):
    result = CliRunner().invoke(main, ["create-project", "--help"])
    assert "[deepdanbooru|modern|finetune]" in result.output.replace("\n", "").replace(" ", "")
    bad = CliRunner().invoke(main, ["create-project", str(tmp_path / "p"), "--recipe", "fast"])
    assert bad.exit_code == 2 and not (tmp_path / "p").exists()


@pytest.mark.parametrize("recipe", ["modern", "finetune"])
def test_the_recipes_are_valid_projects_of_this_version(tmp_path, recipe):
    """Every key of the recipe is known and valid: no unknown-key warning, no refused value."""
    data = {**default_project_json(), **recipes.RECIPES[recipe]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = parse_config(data, tmp_path)
    for key, value in recipes.RECIPES[recipe].items():
        got = getattr(config, key)
        if key == "learning_rates":  # parsed into steps
            got = [{"used_epoch": step.used_epoch, "learning_rate": step.learning_rate} for step in got]
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    result = CliRunner().invoke(main, ["create-project", str(tmp_path / "m"), "--recipe", recipe])
    assert result.exit_code == 0, result.output


def test_the_finetune_recipe_is_the_fine_tuning_run_that_led_in_docs_quality():
    """Its training values are those of the fine-tuning run of the transfer bench that kept the source's tags
    (rsm_wise_fit); only the bench's own settings (its source model, the backbone that reads it, checkpoint
    size, epoch_count "fit" under the bench's time limit) differ, and the split: the bench keeps one split for
    every recipe it compares, the recipe's validation_fraction is the walkthrough's (docs/finetuning.md)."""
    measured = json.loads((Path(__file__).parents[1] / "bench" / "transfer_recipes.json").read_text())
    measured = measured["rsm_wise_fit"]
    bench_only = {"source_model", "model", "checkpoint_frequency_mb", "epoch_count"}
    recipe = {key: value for key, value in recipes.RECIPES["finetune"].items()
              if key not in ("epoch_count", "validation_fraction")}
    assert {key: value for key, value in measured.items() if key not in bench_only} == recipe
    assert recipes.RECIPES["finetune"]["validation_fraction"] == 0.2


@pytest.mark.slow
def test_the_finetune_recipe_trains_the_last_two_blocks_of_its_source_compiled(tmp_path, sample_dataset):
    """create-project --recipe finetune, then a --source-model run: the recipe's trainable_blocks 2 meets the
    source's blocks (the vit_wd fixture has 2: all of them and the head), and the ViT trains under XLA."""
    database, tags = sample_dataset
    project = tmp_path / "p"
    runner = CliRunner()
    assert runner.invoke(main, ["create-project", str(project), "--recipe", "finetune"]).exit_code == 0
    config = json.loads((project / "project.json").read_text())
    assert config["trainable_blocks"] == 2
    config.update(database_path=str(database), image_width=32, image_height=32, minimum_tag_count=1,
                  epoch_count=1, minibatch_size=8, validation_fraction=0.2)
    (project / "project.json").write_text(json.dumps(config))
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    source = Path(__file__).resolve().parent / "fixtures" / "timm" / "vit_wd"
    result = runner.invoke(main, ["train-project", str(project), "--source-model", str(source)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("Trainable: last 2 of 2 blocks + head") for line in lines), result.output
    assert any(line.startswith('jit_compile "auto": the training step and validation compile') for line in lines)
    assert not any("runs without XLA" in line for line in lines)
    assert list(project.glob("model-*.keras"))
