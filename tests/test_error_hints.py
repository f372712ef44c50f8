"""One-line errors that say what to do: the --help of the command at fault, a trailing comma named as such."""

import json

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.errors import ConfigError, json_error_text
from deepdanbooru.project.config import load_config


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args], prog_name="deepdanbooru")


@pytest.mark.parametrize("args, hint", [
    (["evaluate", "a.png", "--threshold"], "deepdanbooru evaluate --help lists the options"),
    (["evaluate-project", "P", "--metrics", "--split"], "deepdanbooru evaluate-project --help lists the options"),
    (["check-bundle", "B", "a.png", "--tolerance"], "deepdanbooru check-bundle --help lists the options"),
    (["evaluate", "--bogus"], "deepdanbooru evaluate --help lists the options"),
    (["--bogus"], "(deepdanbooru --help lists the options)"),
    (["--debug"], "(deepdanbooru --help lists the commands)"),
])
def test_a_usage_error_points_at_the_help_that_lists_the_fix(args, hint):
    result = run_cli(*args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(hint if hint[-1] == ")" else
                                                                                   f"({hint})")


@pytest.mark.parametrize("text, where, what", [
    ('{\n  "model": "resnet_small",\n  "image_width": 64,\n}\n', "line 3 column 20",
     "a trailing comma after the last entry of an object (before the '}' at line 4)"),
    ('{"learning_rates": [\n  {"used_epoch": 1, "learning_rate": 0.1},\n]}', "line 2 column 42",
     "a trailing comma after the last item of a list (before the ']' at line 3)"),
])
def test_a_trailing_comma_in_project_json_is_named(tmp_path, text, where, what):
    (tmp_path / "project.json").write_text(text)
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path)
    assert str(raised.value) == (f"{tmp_path / 'project.json'}: invalid JSON at {where}: {what}; JSON allows no "
                                 "comma there, delete it")
    result = run_cli("train-project", tmp_path)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and what in result.output


@pytest.mark.parametrize("text, message", [
    ('{"a": 1 "b": 2}', "invalid JSON at line 1 column 9: Expecting ',' delimiter"),
    ('{"a": [1, , 2]}', "invalid JSON at line 1 column 11: Expecting value"),  # a comma before an item: not trailing
    ('{"a": 1,', "invalid JSON at line 1 column 9: Expecting property name enclosed in double quotes"),
])
def test_other_json_errors_keep_their_own_words(text, message):
    with pytest.raises(json.JSONDecodeError) as raised:
        json.loads(text)
    assert json_error_text(raised.value) == message
