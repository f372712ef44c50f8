"""Entry points shared by scripts/*.py and `deepdanbooru preflight`: run the checks, print, exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepdanbooru import exitcodes

from deepdanbooru.preflight import checks, probes
from deepdanbooru.preflight.options import DEFAULT_MAX_IMAGE_CHECKS, PREFLIGHT_OPTIONS, VALIDATE_OPTIONS
from deepdanbooru.preflight.results import exit_code, render_json, render_text


def training_preflight(
    project,
    max_image_checks: int = DEFAULT_MAX_IMAGE_CHECKS,
    check_packages: bool = False,
    probe_imports: bool = False,
    probe_tensorflow: bool = False,
    check_duplicates: bool = False,
    source_model=None,
):
    """Every check docs/preflight.md lists that the options ask for; a list of CheckResult. Writes nothing."""
    run = checks.Run(project, max_image_checks, check_duplicates=check_duplicates, source_model=source_model)
    try:
        results = checks.run_checks(run, checks.PROJECT_CHECKS)
    finally:
        run.close()
    if check_packages:
        results += probes.check_packages()
    if probe_imports:
        results += probes.probe_imports()
    if probe_tensorflow:
        results += probes.probe_tensorflow(run.image_paths)
    return results


def validate_project_config(project, check_paths: bool = False):
    run = checks.Run(project)
    try:
        return checks.run_checks(run, checks.CONFIG_CHECKS + (checks.PATH_CHECKS if check_paths else ()))
    finally:
        run.close()


def report(project, results, as_json: bool = False, echo=print) -> int:
    echo(render_json(project, results) if as_json else render_text(results))
    return exit_code(results)


def usage_error(project) -> str | None:
    """Bad usage (exitcodes.USAGE): there is no project to check at all."""
    path = Path(project)
    if not path.exists():
        return f"{path}: project directory not found"
    if not path.is_dir():
        return f"{path}: is not a directory"
    return None


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _parse(prog: str, description: str, project_help: str, options, argv):
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("project", help=project_help)
    for option in options:
        if option.metavar:
            parser.add_argument(option.flag, dest=option.name, metavar=option.metavar, help=option.help)
        elif option.choices:
            parser.add_argument(option.flag, dest=option.name, choices=option.choices, default=option.default,
                                help=f"{option.help} (default {option.default})")
        elif option.default is None:
            parser.add_argument(option.flag, dest=option.name, action="store_true", help=option.help)
        else:
            parser.add_argument(option.flag, dest=option.name, type=_non_negative, default=option.default,
                                metavar="N", help=f"{option.help} (default {option.default})")
        if option.alias:
            spelling, value = option.alias
            parser.add_argument(spelling, dest=option.name, action="store_const", const=value,
                                help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)  # exits 2 on bad usage
    problem = usage_error(arguments.project)
    if problem:
        parser.error(problem)
    return arguments


def training_preflight_main(argv=None) -> int:
    arguments = _parse(
        "training_preflight.py",
        f"Read-only checks of a project before train-project. Exit {exitcodes.OK}: all good, "
        f"{exitcodes.FAILED}: a check failed, {exitcodes.USAGE}: bad usage.",
        "project directory (holds project.json and tags.txt)", PREFLIGHT_OPTIONS, argv)
    results = training_preflight(arguments.project, arguments.max_image_checks, arguments.check_packages,
                                 arguments.probe_imports, arguments.probe_tensorflow, arguments.check_duplicates,
                                 arguments.source_model)
    return report(arguments.project, results, arguments.output_format == "json")


def validate_project_config_main(argv=None) -> int:
    arguments = _parse(
        "validate_project_config.py",
        f"Validate PROJECT/project.json. Exit {exitcodes.OK}: valid, {exitcodes.FAILED}: invalid, "
        f"{exitcodes.USAGE}: bad usage.",
        "project directory (holds project.json)", VALIDATE_OPTIONS, argv)
    results = validate_project_config(arguments.project, arguments.check_paths)
    return report(arguments.project, results, arguments.output_format == "json")


def script(main) -> None:
    """Run a script entry point with the exit code it returns."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(exitcodes.INTERRUPTED)

