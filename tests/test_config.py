import json
import math
import warnings
from pathlib import Path

import pytest

from deepdanbooru.errors import ConfigError
from deepdanbooru.project.config import KEYS, default_project_json, load_config


def write(tmp_path: Path, data) -> Path:
    text = data if isinstance(data, str) else json.dumps(data)
    (tmp_path / "project.json").write_text(text, encoding="utf-8")
    return tmp_path


# The project.json DeepDanbooru 1.0's create-project wrote (key set and values).
DEEPDANBOORU_1_0 = {
    "image_width": 299,
    "image_height": 299,
    "database_path": None,
    "minimum_tag_count": 20,
    "model": "resnet_custom_v2",
    "minibatch_size": 32,
    "epoch_count": 10,
    "export_model_per_epoch": 10,
    "checkpoint_frequency_mb": 200,
    "console_logging_frequency_mb": 10,
    "optimizer": "adam",
    "learning_rate": 0.001,
    "rotation_range": [0.0, 360.0],
    "scale_range": [0.9, 1.1],
    "shift_range": [-0.1, 0.1],
    "mixed_precision": False,
}


def test_deepdanbooru_1_0_project_loads_unchanged(tmp_path):
    data = dict(DEEPDANBOORU_1_0, database_path="data/posts.sqlite",
                learning_rates=[{"used_epoch": 0, "learning_rate": 0.01}, {"used_epoch": 5, "learning_rate": 0.001}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = load_config(write(tmp_path, data))
    assert config.model == "resnet_custom_v2"
    assert config.input_shape == (299, 299, 3)
    assert config.rotation_range == (0.0, 360.0)
    assert config.database_path == tmp_path / "data/posts.sqlite"
    assert config.validation_fraction == 0.0  # old projects train on everything
    assert config.seed == 0
    assert config.image_extensions == ("png", "jpg", "jpeg")


def test_empty_object_gives_all_defaults(tmp_path):
    config = load_config(write(tmp_path, {}))
    for key in KEYS:
        assert getattr(config, key.name) == (None if key.name == "database_path" else key.default)


def test_absolute_database_path_kept(tmp_path):
    config = load_config(write(tmp_path, {"database_path": "/data/x.sqlite"}))
    assert config.database_path == Path("/data/x.sqlite")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("image_width", True, "image_width: must be an integer, got true"),
        ("image_width", 299.0, "image_width: must be an integer, got 299.0"),
        ("image_width", "299", 'image_width: must be an integer, got "299"'),
        ("image_width", 0, "image_width: must be >= 1, got 0"),
        ("image_height", -5, "image_height: must be >= 1, got -5"),
        ("image_width", 2147483648, "image_width: must be <= 8192, got 2147483648"),
        ("minimum_tag_count", -1, "minimum_tag_count: must be >= 0, got -1"),
        ("minibatch_size", 0, "minibatch_size: must be >= 1, got 0"),
        ("epoch_count", 1.5, 'epoch_count: must be an integer >= 1 or "fit", got 1.5'),
        ("epoch_count", 0, 'epoch_count: must be an integer >= 1 or "fit", got 0'),
        ("epoch_count", "fits", 'epoch_count: must be an integer >= 1 or "fit", got "fits" (did you mean \'fit\'?)'),
        ("epoch_count", "auto", 'epoch_count: must be an integer >= 1 or "fit", got "auto"'),
        ("export_model_per_epoch", -1, "export_model_per_epoch: must be >= 0"),
        ("checkpoint_frequency_mb", 0, "checkpoint_frequency_mb: must be >= 1"),
        ("console_logging_frequency_mb", None, "console_logging_frequency_mb: must be an integer, got null"),
        ("model", "resnet_custom_v5", "model: must be one of"),
        ("model", "resnet_smal", "did you mean 'resnet_small'?"),
        ("model", 3, "model: must be a string, got 3"),
        ("loss", "mse", "loss: must be one of binary_crossentropy, focal_loss"),
        ("optimizer", "adamx", "optimizer: must be one of adam, sgd, rmsprop, adamw, lamb, got \"adamx\""),
        ("learning_rate", 0, "learning_rate: must be > 0.0, got 0"),
        ("learning_rate", "0.1", 'learning_rate: must be a number, got "0.1"'),
        ("learning_rate", False, "learning_rate: must be a number, got false"),
        ("learning_rates", {"used_epoch": 1}, "learning_rates: must be a list"),
        ("learning_rates", [{"used_epoch": 1}], "learning_rates: entry 0 is missing learning_rate"),
        ("learning_rates", [{"used_epoch": -1, "learning_rate": 0.1}], "entry 0: used_epoch must be >= 0"),
        ("learning_rates", [{"used_epoch": 1, "learning_rate": 0}], "entry 0: learning_rate must be > 0.0"),
        ("learning_rates", [{"used_epoch": 1, "learning_rate": 0.1, "x": 1}], "entry 0 has unknown key(s) x"),
        ("learning_rates", [3], "entry 0 must be an object"),
        ("rotation_range", [10, 0], "rotation_range: low must be <= high"),
        ("rotation_range", [0, 1, 2], "rotation_range: must have exactly 2 numbers"),
        ("rotation_range", "0-360", "rotation_range: must be a [low, high] list or null"),
        ("scale_range", [0, 1], "scale_range: low must be > 0"),
        ("scale_range", [0.5, True], "scale_range: must be a number, got true"),
        ("shift_range", [0.2, -0.2], "shift_range: low must be <= high"),
        ("mixed_precision", 1, "mixed_precision: must be true or false, got 1"),
        ("mixed_precision", "true", 'mixed_precision: must be true or false, got "true"'),
        ("database_path", 5, "database_path: must be a string path or null"),
        ("database_path", "", "database_path: must not be an empty string"),
        ("seed", -1, "seed: must be >= 0"),
        ("image_extensions", ["png", "tiff"], "image_extensions: entries must be among"),
        ("image_extensions", [], "image_extensions: must be a non-empty list"),
        ("max_bad_image_fraction", 1.5, "max_bad_image_fraction: must be <= 1.0"),
        ("max_image_pixels", 0, "max_image_pixels: must be >= 1"),
        ("pack_quality", 101, "pack_quality: must be <= 100, got 101"),
        ("pack_quality", 40, "pack_quality: must be >= 50, got 40"),
        ("pack_quality", 92.5, "pack_quality: must be an integer"),
        ("validation_fraction", 0.6, "validation_fraction: must be <= 0.5"),
        ("validation_fraction", -0.1, "validation_fraction: must be >= 0.0"),
        ("validation_frequency_slices", -1, "validation_frequency_slices: must be >= 0"),
        ("validation_threshold", 2, "validation_threshold: must be <= 1.0"),
        ("best_model_metric", "f1", "best_model_metric: must be one of"),
        ("gradient_clip_norm", 0, "gradient_clip_norm: must be > 0.0"),
        ("layer_decay", 0, "layer_decay: must be > 0.0"),
        ("layer_decay", 1.5, "layer_decay: must be <= 1.0"),
        ("layer_decay", "x", "layer_decay: must be a number"),
        ("trainable_blocks", -1, "trainable_blocks: must be >= 0, got -1"),
        ("trainable_blocks", 1.5, "trainable_blocks: must be an integer, got 1.5"),
        ("trainable_blocks", "2", 'trainable_blocks: must be an integer, got "2"'),
    ],
)
def test_bad_values_name_file_key_and_value(tmp_path, key, value, message):
    write(tmp_path, {key: value})
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'project.json'}: {key}")
    assert message in text


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"learning_rate": NaN}', "project.json: learning_rate: must be a finite number, got NaN"),
        ('{"learning_rate": Infinity}', "project.json: learning_rate: must be a finite number, got Infinity"),
        ('{"learning_rate": -Infinity}', "project.json: learning_rate: must be a finite number, got -Infinity"),
        ('{"validation_threshold": NaN}', "project.json: validation_threshold: must be a finite number, got NaN"),
        ('{"scale_range": [0.9, Infinity]}', "project.json: scale_range: must be a finite number, got Infinity"),
        ('{"gradient_clip_norm": NaN}', "project.json: gradient_clip_norm: must be a finite number, got NaN"),
        ('{"minibatch_size": NaN}', "project.json: minibatch_size: must be an integer, got NaN"),
        ('{"learning_rates": [{"used_epoch": 1, "learning_rate": NaN}]}',
         "project.json: learning_rates: entry 0: learning_rate must be a finite number, got NaN"),
        ('{"learning_rate": 1e999}', "learning_rate: must be a finite number"),
        ('{\n  "image_width": 299,\n  "model": }\n', r"project.json: invalid JSON at line 3"),
        ("[1, 2]", "must hold a JSON object, got list"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "project.json: invalid JSON: nested too deeply to read"),
    ],
)
def test_unparseable_or_non_finite_text_is_refused(tmp_path, text, message):
    write(tmp_path, text)
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path)


def test_a_key_given_twice_warns_and_the_last_is_used_as_json_readers_do(tmp_path):
    write(tmp_path, '{"image_width": 32, "image_width": 64, "learning_rates": [{"used_epoch": 1, "used_epoch": 2, '
                    '"learning_rate": 0.1}]}')
    with pytest.warns(UserWarning) as caught:
        config = load_config(tmp_path)
    assert config.image_width == 64 and config.learning_rates[0].used_epoch == 2
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'project.json'}: {key}: given more than once; the last one is used: keep only the one you mean"
        for key in ("used_epoch", "image_width")]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="project.json: not found"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="project directory not found"):
        load_config(tmp_path / "nope")


def test_misspelt_key_is_an_error_naming_both(tmp_path):
    write(tmp_path, {"minibatch_sise": 8})
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value) == (f"{tmp_path / 'project.json'}: minibatch_sise: unknown key; did you mean "
                                 "'minibatch_size'? (as written it would be ignored and minibatch_size would stay 32)")


@pytest.mark.parametrize("key, value, meant", [
    ("epochs", 30, "another tool's name; deepdanbooru's is epoch_count (as written it would be ignored and "
                   "epoch_count would stay 10)"),
    ("lr", 0.01, "another tool's name; deepdanbooru's is learning_rate (as written it would be ignored and "
                 "learning_rate would stay 0.001)"),
    ("image_size", 448, "another tool's name; deepdanbooru's is image_width and image_height (as written it would "
                        "be ignored and image_width would stay 299 and image_height would stay 299)"),
])
def test_another_tool_s_key_is_an_error_naming_ours(tmp_path, key, value, meant):
    write(tmp_path, {key: value})
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value) == f"{tmp_path / 'project.json'}: {key}: unknown key; {meant}"


def test_every_problem_is_reported_at_once(tmp_path):
    write(tmp_path, {"epochs": 30, "learning_rate": -1, "model": "resnet_smal", "asl_clip": 0.1, "notes": "x"})
    with pytest.warns(UserWarning, match="unknown key 'notes'"), pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    source = tmp_path / "project.json"
    assert [problem.split(": ")[1] for problem in caught.value.problems] == [
        "model", "learning_rate", "asl_clip", "epochs"]  # key-table order, then unknown keys
    assert str(caught.value).startswith(f"4 problems: {source}: model: must be one of")
    assert "\n" not in str(caught.value)


def test_unrelated_unknown_key_only_warns(tmp_path):
    write(tmp_path, {"my_notes": "x"})
    with pytest.warns(UserWarning, match="unknown key 'my_notes' is ignored$"):
        config = load_config(tmp_path)
    assert config.unknown_keys == ("my_notes",)


def test_a_command_checks_only_the_keys_it_uses(tmp_path):
    write(tmp_path, {"model": "resnet_bogus", "modle": "x", "minimum_tag_count": 3})
    with pytest.warns(UserWarning) as caught:
        config = load_config(tmp_path, uses=("minimum_tag_count",))
    assert config.minimum_tag_count == 3 and config.model == "resnet_custom_v2"
    messages = [str(w.message) for w in caught]
    assert any("model: must be one of" in m and "not used by this command" in m for m in messages)
    assert any("unknown key 'modle' is ignored (did you mean 'model'?)" in m for m in messages)
    with pytest.raises(ConfigError, match="model: must be one of"):
        load_config(tmp_path)


@pytest.mark.parametrize("value", [None, []])
def test_ranges_disabled(tmp_path, value):
    config = load_config(write(tmp_path, {"rotation_range": value, "scale_range": value, "shift_range": value}))
    assert config.rotation_range is None and config.scale_range is None and config.shift_range is None


def test_learning_rate_schedule_uses_last_matching_entry_in_list_order(tmp_path):
    schedule = [
        {"used_epoch": 0, "learning_rate": 0.1},
        {"used_epoch": 3, "learning_rate": 0.01},
        {"used_epoch": 2, "learning_rate": 0.05},
    ]
    config = load_config(write(tmp_path, {"learning_rate": 0.5, "learning_rates": schedule}))
    # List order, not epoch order: at epoch 3 both later entries match, the last one wins.
    assert [config.learning_rate_for_epoch(e) for e in range(5)] == [0.1, 0.1, 0.05, 0.05, 0.05]
    later = load_config(write(tmp_path, {"learning_rate": 0.5, "learning_rates": [{"used_epoch": 2, "learning_rate": 0.2}]}))
    assert [later.learning_rate_for_epoch(e) for e in range(3)] == [0.5, 0.5, 0.2]


def test_integers_accepted_for_floats(tmp_path):
    config = load_config(write(tmp_path, {"learning_rate": 1, "rotation_range": [0, 90]}))
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)
    assert config.rotation_range == (0.0, 90.0)


def test_config_is_frozen(tmp_path):
    config = load_config(write(tmp_path, {}))
    with pytest.raises(Exception):
        config.image_width = 3


def test_require_database(tmp_path):
    config = load_config(write(tmp_path, {}))
    with pytest.raises(ConfigError, match="database_path: is null"):
        config.require_database()
    config = load_config(write(tmp_path, {"database_path": "missing.sqlite"}))
    with pytest.raises(ConfigError, match="database_path: file not found"):
        config.require_database()
    (tmp_path / "data").mkdir()
    config = load_config(write(tmp_path, {"database_path": "data"}))
    with pytest.raises(ConfigError, match="database_path: is a folder, not the SQLite file: "):
        config.require_database()


def test_default_project_json_roundtrips_in_spec_order(tmp_path):
    data = default_project_json()
    assert list(data)[:5] == ["image_width", "image_height", "database_path", "minimum_tag_count", "model"]
    assert "learning_rates" not in data
    assert data["validation_fraction"] == 0.05
    config = load_config(write(tmp_path, data))
    assert config.validation_fraction == 0.05
    assert not math.isnan(config.learning_rate)


def test_epoch_count_fit_is_accepted_and_needs_a_time_limit_to_train(tmp_path):
    config = load_config(write(tmp_path, {"epoch_count": "fit", "lr_schedule": "warmup_cosine"}))
    assert config.epoch_count == "fit"
    config.require_epoch_count(360.0)  # with --time-limit: nothing to say
    with pytest.raises(ConfigError) as caught:
        config.require_epoch_count(None)
    assert str(caught.value) == (
        f'{tmp_path / "project.json"}: epoch_count: "fit" plans the epochs that fit train-project\'s --time-limit, '
        "and none was given; give --time-limit (e.g. --time-limit 6m) or set epoch_count to a number of epochs")
    load_config(write(tmp_path, {"epoch_count": 3})).require_epoch_count(None)  # a number needs no limit


def fit_refusal(tmp_path, learning_rates) -> str:
    write(tmp_path, {"epoch_count": "fit", "learning_rates": learning_rates})
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    return str(caught.value)


def test_epoch_count_fit_refuses_drops_at_fixed_epochs_and_says_them_as_used_fraction(tmp_path):
    from deepdanbooru.project.recipes import RECIPES

    # A modern project switched to "fit": the fractions of its own drops over the recipe's 40 epochs.
    assert fit_refusal(tmp_path, RECIPES["modern"]["learning_rates"]) == (
        f"{tmp_path / 'project.json'}: learning_rates: entry 0: used_epoch 27 is a fixed epoch, which epoch_count "
        '"fit" cannot stretch over the epochs it plans; give the drops as used_fraction, the share of the epochs '
        "after which each applies (used_epoch 27 of epoch_count 40 is used_fraction 0.675, used_epoch 37 of "
        'epoch_count 40 is used_fraction 0.925), use lr_schedule "warmup_cosine", or set epoch_count to a number')
    # Drops of its own: the count they were written for is unknown, so the rule with their epoch. A drop at
    # used_epoch 0 is the rate from the start, which no count moves.
    message = fit_refusal(tmp_path, [{"used_epoch": 0, "learning_rate": 0.1}, {"used_epoch": 5, "learning_rate": 0.01}])
    assert message.startswith(f"{tmp_path / 'project.json'}: learning_rates: entry 1: used_epoch 5 is a fixed epoch")
    assert "used_epoch 5 of epoch_count N is used_fraction 5/N" in message and "\n" not in message
    # A constant rate (steps without learning_rates) has nothing to stretch; drops at shares of it stretch.
    assert load_config(write(tmp_path, {"epoch_count": "fit"})).lr_schedule == "steps"
    config = load_config(write(tmp_path, {"epoch_count": "fit", "learning_rates": [
        {"used_epoch": 0, "learning_rate": 0.1}, {"used_fraction": 0.675, "learning_rate": 0.01}]}))
    assert config.learning_rates[1].used_fraction == 0.675 and config.learning_rates[1].used_epoch is None


@pytest.mark.parametrize("entry, message", [
    ({"learning_rate": 0.1}, "entry 0 is missing used_epoch and used_fraction; give exactly one"),
    ({"used_epoch": 2, "used_fraction": 0.5, "learning_rate": 0.1},
     "entry 0 gives both used_epoch and used_fraction; give exactly one"),
    ({"used_fraction": 0, "learning_rate": 0.1}, "entry 0: used_fraction must be > 0.0, got 0"),
    ({"used_fraction": 1, "learning_rate": 0.1}, "entry 0: used_fraction must be < 1.0, got 1"),
    ({"used_fraction": "0.5", "learning_rate": 0.1}, 'entry 0: used_fraction must be a number, got "0.5"'),
    ({"used_fraction": 0.5}, "entry 0 is missing learning_rate"),
])
def test_a_drop_gives_used_epoch_or_used_fraction(tmp_path, entry, message):
    write(tmp_path, {"learning_rates": [entry]})
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'project.json'}: learning_rates: {message}")
    assert "\n" not in str(caught.value)


def test_a_used_fraction_drop_applies_from_the_epoch_ceil_of_its_share(tmp_path):
    drops = [{"used_fraction": 0.28, "learning_rate": 0.1}, {"used_fraction": 0.675, "learning_rate": 0.01}]
    config = load_config(write(tmp_path, {"epoch_count": 25, "learning_rate": 1.0, "learning_rates": drops}))
    # 0.28 x 25 is 7.000000000000001 in floats: still epoch 7, as used_epoch 7 of 25; 0.675 x 25 = 16.875 -> 17.
    assert [config.learning_rate_for_epoch(e) for e in (0, 6, 7, 16, 17, 24)] == [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    # Over another count: 0.28 x 5 = 1.4 -> epoch 2, 0.675 x 5 = 3.375 -> epoch 4.
    assert [config.learning_rate_for_epoch(e, 5) for e in range(5)] == [1.0, 1.0, 0.1, 0.1, 0.01]
    # Not planned yet (epoch_count "fit" before the run has timed a slice): no share placed.
    assert config.learning_rate_for_epoch(24, math.inf) == 1.0
    fit = load_config(write(tmp_path, {"epoch_count": "fit", "learning_rate": 1.0, "learning_rates": drops}))
    assert fit.learning_rate_for_epoch(100) == 1.0 and fit.learning_rate_for_epoch(3, 4) == 0.01
    # In list order, as with used_epoch: from the later share on, an earlier-listed later share loses.
    reordered = load_config(write(tmp_path, {"epoch_count": 25, "learning_rate": 1.0, "learning_rates": drops[::-1]}))
    assert [reordered.learning_rate_for_epoch(e) for e in (6, 7, 17)] == [1.0, 0.1, 0.1]
