"""One option name per concept (docs/cli.md); older spellings are hidden aliases that still work."""

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.cli_vocabulary import TERMS, VOCABULARY, Alias, PositionalAlias, option_names, render

ROOT = Path(__file__).resolve().parents[1]


def commands():
    return sorted(main.commands.items())


def test_docs_show_the_table_generated_from_the_commands():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert text == render(main), "regenerate: python -m deepdanbooru.cli_reference > docs/cli.md"


def test_every_option_of_every_command_is_in_the_table():
    used, aliases_used = set(), set()
    for name, command in [("(group)", main), *commands()]:
        params = {param.name: param for param in command.params}
        for param in command.params:
            if isinstance(param, Alias):
                canonical = option_names(params[param.target])[0]
                assert param.hidden, f"{name} {param.opts[0]}"
                assert param.opts[0] in TERMS[canonical].aliases, f"{name}: {param.opts[0]} not an alias of {canonical}"
                aliases_used.add(param.opts[0])
            elif isinstance(param, click.Option):
                for spelling in option_names(param):
                    assert spelling in TERMS or spelling.startswith("--no-"), f"{name}: {spelling} not in VOCABULARY"
                    used.add(spelling)
            elif isinstance(param, PositionalAlias):
                assert option_names(params[param.target])[0] in TERMS
    declared_aliases = {alias for term in VOCABULARY for alias in term.aliases}
    assert declared_aliases == aliases_used, "an alias in the table that no command has (or the reverse)"
    assert set(TERMS) == used | {"--help", "--version", "--debug"}, "a term in the table that no command uses"


@pytest.mark.parametrize("name", sorted(main.commands))
def test_help_shows_only_canonical_names(name):
    output = CliRunner().invoke(main, [name, "--help"]).output
    for term in VOCABULARY:
        for alias in term.aliases:
            assert f"{alias} " not in output and f"{alias}," not in output, f"{name} --help shows {alias}"
    if name == "grad-cam":
        assert "Usage: main grad-cam [OPTIONS] PROJECT_PATH TARGET\n" in output


def test_aliases_do_what_the_canonical_options_do(tmp_path, sample_project):
    runner = CliRunner()
    project = tmp_path / "new"
    assert runner.invoke(main, ["create-project", str(project)]).exit_code == 0
    (project / "project.json").write_text("{}")
    result = runner.invoke(main, ["create-project", str(project), "--force"])
    assert result.exit_code == 0, result.output
    assert json.loads((project / "project.json").read_text())["model"] == "resnet_custom_v2"
    refused = runner.invoke(main, ["create-project", str(project)])
    assert refused.exit_code == 2 and "already exists; use --overwrite to replace it" in refused.output

    old = runner.invoke(main, ["make-tags", str(sample_project), "--min-count", "3", "--output", str(tmp_path / "a")])
    new = runner.invoke(main, ["make-tags", str(sample_project), "--minimum-post-count", "3",
                               "--save-path", str(tmp_path / "b")])
    assert old.exit_code == new.exit_code == 0, old.output + new.output
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text()

    named = runner.invoke(main, ["preflight", "--format", "json", "--project-path", str(sample_project)])
    assert named.output == runner.invoke(main, ["preflight", str(sample_project), "--format", "json"]).output
    assert "--project-path" not in runner.invoke(main, ["preflight", "--help"]).output

    as_json = runner.invoke(main, ["preflight", str(sample_project), "--json"])
    assert json.loads(as_json.output)["checks"][0]["name"] == "config"
    assert as_json.output == runner.invoke(main, ["preflight", str(sample_project), "--format", "json"]).output

    clash = runner.invoke(main, ["make-tags", str(sample_project), "--min-count", "3", "--minimum-post-count", "4"])
    assert clash.exit_code == 2
    assert "--min-count (an older spelling of --minimum-post-count) contradicts --minimum-post-count" in clash.output
    same = runner.invoke(main, ["make-tags", str(sample_project), "--min-count", "3", "--minimum-post-count", "3",
                                "--save-path", str(tmp_path / "c")])
    assert same.exit_code == 0, same.output


def test_evaluate_project_model_alias_counts_as_a_metrics_option(sample_project):
    result = CliRunner().invoke(main, ["evaluate-project", str(sample_project), "x.png", "--model", "m.keras"])
    assert result.exit_code == 2 and "--model-path can only be used with --metrics" in result.output
