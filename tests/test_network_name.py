"""One name for the network that trains: a timm architecture name with other arguments names another network, so
the arguments that size it are part of its name (import, fine-tune, exports, state.json, preflight, the report)."""

import json
import shutil
from pathlib import Path

import pytest
from test_import_timm import _synthetic_checkpoint

from deepdanbooru.models.timm.source import network_name, read_source

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "timm"


@pytest.mark.parametrize("fixture, name", [
    ("vit_wd", "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32"),
    ("vit_map", "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32_24"),
    ("convnext", "convnext_tiny-depths1_1_2_1-dims16_16_24_32"),
    ("swinv2_wd", "swinv2_base_window8_256-depths2_2_1_1-dim8-heads2_4_4_4-patch2-window6-img48"),
])
def test_the_name_says_the_arguments_that_size_the_network(fixture, name):
    assert network_name(read_source(FIXTURES / fixture)) == name


def test_what_the_architecture_name_already_says_is_left_out(tmp_path):
    folder = tmp_path / "plain"
    shutil.copytree(FIXTURES / "vit_wd", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"] = {"patch_size": 16, "img_size": [224, 224], "class_token": False, "global_pool": "avg"}
    (folder / "config.json").write_text(json.dumps(config))
    assert network_name(read_source(folder)) == "vit_base_patch16_224"
    config["model_args"].update(img_size=448, mlp_ratio=2.5)
    (folder / "config.json").write_text(json.dumps(config))
    source = read_source(folder)
    assert network_name(source) == "vit_base_patch16_224-mlp2p5-img448"
    assert network_name(source, (64, 48)) == "vit_base_patch16_224-mlp2p5-img64_48"  # resampled to the project's


def test_import_model_names_the_keras_model_and_its_file_truly(tmp_path):
    """The 6-block, 192-wide case in small: a folder saying vit_base_patch16_224 with 2 blocks, 32 wide."""
    from deepdanbooru.models.timm import vit
    from deepdanbooru.models.timm.checkpoint import import_checkpoint

    folder = _synthetic_checkpoint(tmp_path / "vit", "vit_base_patch16_224", {
        "embed_dim": 32, "depth": 2, "num_heads": 4, "patch_size": 8, "img_size": 32, "class_token": False,
        "global_pool": "avg", "fc_norm": False}, vit, (32, 32))
    model = import_checkpoint(folder).model
    assert model.name == "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32"
    assert model.count_params() < 40_000  # a vit_base would hold 86M
    resized = import_checkpoint(folder, input_size=(48, 48)).model
    assert resized.name == "vit_base_patch16_224-depth2-dim32-heads4-patch8-img48"


def test_preflight_source_model_from_the_script_without_third_party_packages_and_from_the_cli(sample_project):
    from click.testing import CliRunner
    from test_preflight import run_blocked

    from deepdanbooru.cli import main

    folder = FIXTURES / "vit_wd"
    expected = "vit_base_patch16_224-depth2-dim32-heads4-patch8-img32 (the network of --source-model"
    outcome, out = run_blocked("training_preflight.py", sample_project, "--max-image-checks", "0",
                               "--source-model", folder, "--format", "json")
    assert outcome["attempts"] == [] and outcome["loaded"] == [], out
    model = {check["name"]: check for check in json.loads(out)["checks"]}["model"]
    assert model["status"] == "PASS" and model["detail"].startswith(expected)
    result = CliRunner().invoke(main, ["preflight", str(sample_project), "--max-image-checks", "0",
                                       "--source-model", str(folder)])
    assert "PASS  model" in result.output and expected in result.output, result.output
    missing = CliRunner().invoke(main, ["preflight", str(sample_project), "--source-model", str(folder / "gone")])
    assert missing.exit_code == 1 and "FAIL  model" in missing.output and "--source-model not found" in missing.output
