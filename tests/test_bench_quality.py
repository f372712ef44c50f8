"""bench/quality.py without training: recipe checks, curves from history, the table, the PNG."""

import json
import os
import sys
from pathlib import Path

import pytest
from PIL import Image

from bench_modules import load_bench

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def quality():
    sys.path.insert(0, str(BENCH))
    try:
        yield load_bench("quality")
    finally:
        sys.path.remove(str(BENCH))


def test_recipes_the_tool_cannot_run_are_refused_before_training(quality, tmp_path):
    quality.check_recipes(["deepdanbooru", "resnet_small"], quality.RECIPES, tmp_path)
    recipes = {**quality.RECIPES, "typo": {"model": "resnet_small", "horizontal_flop": True},
               "bad": {"model": "resnet_huge"}, "small": {"model": "resnet_152"}}
    with pytest.raises(quality.BenchError) as caught:
        quality.check_recipes(["deepdanbooru", "typo", "bad", "small", "nope"], recipes, tmp_path)
    message = str(caught.value)
    assert "recipe 'typo': the installed deepdanbooru" in message and "horizontal_flop" in message
    assert "recipe 'bad'" in message and "resnet_huge" in message
    assert "recipe 'small'" in message and "193x193" in message
    assert "recipe 'nope' is not defined" in message
    assert "deepdanbooru'" not in message.replace("installed deepdanbooru", "")
    assert not list(tmp_path.iterdir())


# What the bench sets for its own measurement: image size and data, the split, how often it checkpoints,
# validates, logs and exports. Nothing else may differ from what create-project writes.
BENCH_SETTINGS = {"image_width", "image_height", "database_path", "minimum_tag_count", "image_extensions",
                  "validation_fraction", "validation_frequency_slices", "checkpoint_frequency_mb",
                  "console_logging_frequency_mb", "export_model_per_epoch"}


def test_the_bench_trains_what_create_project_recipe_modern_writes(quality, tmp_path):
    from dataclasses import fields

    from deepdanbooru.project.config import parse_config
    from deepdanbooru.project.create import create_project

    create_project(tmp_path / "created", recipe="modern", echo=lambda *_: None)
    created = parse_config(json.loads((tmp_path / "created" / "project.json").read_text()), tmp_path)
    measured = parse_config(quality.project_json(quality.RECIPES["modern"], 64), tmp_path)
    differing = {f.name for f in fields(created) if getattr(created, f.name) != getattr(measured, f.name)}
    assert differing - BENCH_SETTINGS == set()
    # The training keys themselves came through: the recipe's model, loss and optimizer are not the defaults.
    assert (measured.model, measured.loss, measured.optimizer) == ("resnet_small", "asymmetric", "adamw")


def test_curve_reads_validations_within_the_budget(quality, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    started = 1000.0
    lines = [
        {"kind": "train", "time": 1010.0, "used_minibatch": 10},
        {"kind": "validation", "time": 1030.0, "used_epoch": 0, "used_minibatch": 20, "used_sample": 640,
         "macro_f1": 0.1, "micro_f1": 0.3, "map": 0.2, "validation_records": 50, "seconds": 2.0},
        {"kind": "validation", "time": 1090.0, "used_epoch": 1, "used_minibatch": 40, "used_sample": 1280,
         "macro_f1": 0.2, "micro_f1": 0.4, "map": 0.3, "validation_records": 50, "seconds": 2.5},
        {"kind": "validation", "time": 1130.0, "used_epoch": 1, "used_minibatch": 60, "used_sample": 1920,
         "macro_f1": 0.25, "micro_f1": 0.45, "map": 0.35, "validation_records": 50, "seconds": 2.5},
    ]
    (logs / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    points = quality.curve(tmp_path, started, budget=120.0)
    assert [p["minutes"] for p in points] == [0.5, 1.5]
    assert [p["macro_f1"] for p in points] == [0.1, 0.2] and points[1]["used_sample"] == 1280
    assert len(quality.curve(tmp_path, started, budget=None)) == 3


def _result(model, macro, micro, ap, samples=1000):
    return {"config": {"model": model}, "run": {"stopped_by": "signal", "seconds": 60.0},
            "train_records": 500, "validation_share": 0.05,
            "curve": [{"minutes": 1.0, "used_sample": samples, "macro_f1": macro, "micro_f1": micro, "map": ap}]}


def test_table_gives_ratios_to_both_baselines(quality):
    results = {"deepdanbooru": _result("resnet_custom_v4", 0.1, 0.4, 0.2),
               "resnet_small": _result("resnet_small", 0.2, 0.5, 0.25, samples=3000),
               "modern": _result("efficientnetv2_b0", 0.3, 0.6, 0.5)}
    table = quality.summarise(results)
    assert table["modern"]["macro_f1_vs_ddb"] == pytest.approx(3.0)
    assert table["modern"]["macro_f1_vs_resnet"] == pytest.approx(1.5)
    assert table["modern"]["map_vs_ddb"] == pytest.approx(2.5)
    assert table["resnet_small"]["epochs"] == pytest.approx(6.0)
    text = quality.markdown(table, 600)
    assert "| modern | efficientnetv2_b0 | 2.0 | 1000 | 1.0 | 0.3000 (3.00x, 1.50x) |" in text
    assert "ratio to deepdanbooru and resnet_small" in text
    alone = quality.summarise({"modern": results["modern"]})
    assert alone["modern"]["macro_f1_vs_ddb"] is None
    assert "| 0.3000 |" in quality.markdown(alone, 600)


def test_table_gives_macro_f1_at_other_thresholds(quality):
    """A loss that shifts scores wins at 0.5 and can lose at P=R: the second table shows both."""
    shifted = _result("resnet_small", 0.35, 0.65, 0.37)
    shifted["curve"][0].update(macro_f1_040=0.33, pr_f1=0.311, pr_threshold=0.6, calibrated_macro_f1=0.347)
    old = _result("resnet_small", 0.28, 0.75, 0.373)  # a history from before these figures: n/a
    table = quality.summarise({"modern": shifted, "resnet_small": old})
    assert table["modern"]["pr_f1"] == pytest.approx(0.311) and table["resnet_small"]["pr_f1"] is None
    text = quality.markdown(table, 600)
    assert "| modern | 0.3500 | 0.3300 | 0.3110 (0.600) | 0.3470 |" in text
    assert "| resnet_small | 0.2800 | n/a | n/a | n/a |" in text


def test_plots_are_pngs_with_a_line_per_series(quality, tmp_path):
    results = {"a": _result("resnet_small", 0.1, 0.4, 0.2), "b": _result("resnet_small", 0.3, 0.6, 0.5)}
    results["a"]["curve"].insert(0, {"minutes": 0.5, "used_sample": 10, "macro_f1": 0.05, "micro_f1": 0.2,
                                     "map": 0.1})
    written = quality.plots(results, tmp_path)
    assert [p.name for p in written] == ["a.png", "b.png", "curves.png", "curves-map.png"]
    with Image.open(tmp_path / "curves.png") as image:
        assert image.format == "PNG" and image.size == (quality.line_chart.__globals__["WIDTH"],
                                                         quality.line_chart.__globals__["HEIGHT"])
        colours = {colour for _, colour in image.convert("RGB").getcolors(1 << 20)}
    palette = quality.line_chart.__globals__["PALETTE"]
    assert palette[0] in colours and palette[1] in colours


def test_auto_stop_finds_this_train_project_s_time_limit(quality):
    env = dict(os.environ, PYTHONPATH=str(quality.ROOT))
    assert quality.has_time_limit(env)


def test_a_source_model_recipe_passes_the_model_and_its_tags_and_stays_out_of_project_json(quality, tmp_path):
    model = tmp_path / "vit.keras"
    model.write_bytes(b"not read here")
    recipe = {"model": "vit_small_patch16", "source_model": str(model), "learning_rate": 0.0003}
    assert quality.source_arguments(recipe) == ["--source-model", str(model)]
    (tmp_path / "vit.tags.txt").write_text("a\nb\n")
    assert quality.source_arguments(recipe) == ["--source-model", str(model), "--source-tags",
                                                str(tmp_path / "vit.tags.txt")]
    assert quality.source_arguments({"model": "resnet_small"}) == []
    assert "source_model" not in quality.project_json(recipe, 64)
    quality.check_recipes(["ft"], {"ft": recipe}, tmp_path)
    with pytest.raises(quality.BenchError, match="recipe 'gone': source_model .*missing.keras is not a file"):
        quality.check_recipes(["gone"], {"gone": {**recipe, "source_model": str(tmp_path / "missing.keras")}},
                              tmp_path)


def test_an_own_dataset_gives_its_tags_and_image_extensions(quality, tmp_path):
    import sqlite3

    with pytest.raises(quality.BenchError, match="dataset.sqlite is not a file"):
        quality.own_dataset(tmp_path)
    connection = sqlite3.connect(tmp_path / "dataset.sqlite")
    with connection:
        connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT)")
        connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?)",
                               [(1, "a" * 32, "png", "x"), (2, "b" * 32, "jpg", "y"), (3, "c" * 32, "png", "x y")])
    connection.close()
    (tmp_path / "tags.txt").write_text("x\ny\n\n")
    database, tags, base = quality.own_dataset(tmp_path)
    assert database == tmp_path / "dataset.sqlite" and tags == ["x", "y"]
    assert base["image_extensions"] == ["jpg", "png"]
    assert quality.project_json({"model": "resnet_small"}, 64, database, base)["image_extensions"] == ["jpg", "png"]


def test_merge_tables_runs_of_several_invocations_at_one_budget(quality, tmp_path, capsys):
    scores = {"all": {"map": 0.4, "pr_f1": 0.2, "calibrated_macro_f1": 0.25},
              "held_back": {"map": 0.3, "pr_f1": 0.1, "calibrated_macro_f1": 0.15}, "held_back_tags": 7}
    first = tmp_path / "a.json"
    first.write_text(json.dumps({"budget_seconds": 360, "runs": {"modern": _result("resnet_small", 0.1, 0.4, 0.2)}}))
    second = tmp_path / "b.json"
    second.write_text(json.dumps({"budget_seconds": 360, "runs": {
        "finetune": {**_result("vit_small_patch16", 0.2, 0.5, 0.4), "held_back": scores}}}))
    assert quality.merge([first, second], tmp_path / "out", ["x", "y"]) == 0
    text = (tmp_path / "out" / "quality.md").read_text()
    assert "| modern | resnet_small |" in text and "| finetune | vit_small_patch16 |" in text
    assert "held-back" not in text  # modern's export was not scored: no half table
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {"modern.png", "finetune.png", "curves.png",
                                                                   "curves-map.png"}
    first.write_text(json.dumps({"budget_seconds": 360, "runs": {
        "modern": {**_result("resnet_small", 0.1, 0.4, 0.2), "held_back": scores}}}))
    assert quality.merge([first, second], tmp_path / "both", ["x", "y"]) == 0
    assert "| finetune | 0.4000 | 0.2000 | 0.2500 | 0.3000 | 0.1000 | 0.1500 | 7 |" in (
        tmp_path / "both" / "quality.md").read_text()
    second.write_text(json.dumps({"budget_seconds": 600, "runs": {}}))
    assert quality.merge([first, second], tmp_path / "bad") == 2
    assert "budgets differ ([360, 600] s)" in capsys.readouterr().err and not (tmp_path / "bad").exists()
