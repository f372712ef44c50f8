"""Entry points shared by scripts/*.py and `deepdanbooru preflight`: run the checks, print, exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepdanbooru.preflight import checks, probes
from deepdanbooru.preflight.results import exit_code, render_json, render_text


def training_preflight(
    project,
    max_image_checks: int = checks.DEFAULT_MAX_IMAGE_CHECKS,
    check_packages: bool = False,
    probe_imports: bool = False,
    probe_tensorflow: bool = False,
    check_duplicates: bool = False,
):
    """Every check of SPEC section 6 that the options ask for; a list of CheckResult. Writes nothing."""
    run = checks.Run(project, max_image_checks, check_duplicates=check_duplicates)
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
    """Bad usage, exit 2: there is no project to check at all."""
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


def _add_format(parser: argparse.ArgumentParser) -> None:
    """--format text|json, the CLI's name; --json stays as a hidden older spelling."""
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: one line per check; json: one JSON object (default text)")
    parser.add_argument("--json", dest="format", action="store_const", const="json", help=argparse.SUPPRESS)


def _parse(parser: argparse.ArgumentParser, argv):
    arguments = parser.parse_args(argv)  # exits 2 on bad usage
    problem = usage_error(arguments.project)
    if problem:
        parser.error(problem)
    return arguments


def training_preflight_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="training_preflight.py",
        description="Read-only checks of a project before train-project. Exit 0: all good, 1: a check failed, "
                    "2: bad usage.")
    parser.add_argument("project", help="project directory (holds project.json and tags.txt)")
    parser.add_argument("--max-image-checks", type=_non_negative, default=checks.DEFAULT_MAX_IMAGE_CHECKS,
                        metavar="N", help="check the first N eligible images by id; 0 checks all "
                                          f"(default {checks.DEFAULT_MAX_IMAGE_CHECKS})")
    parser.add_argument("--check-packages", action="store_true",
                        help="check installed versions of the runtime packages (no import)")
    parser.add_argument("--probe-imports", action="store_true",
                        help="import each runtime package in a child process and report its version")
    parser.add_argument("--probe-tensorflow", action="store_true",
                        help="run TensorFlow in a child process: compute on the CPU, decode the sampled images")
    parser.add_argument("--check-duplicates", action="store_true",
                        help="read every eligible image: identical files and near-identical pictures (dHash, "
                             "needs Pillow) on both sides of the validation split")
    _add_format(parser)
    arguments = _parse(parser, argv)
    results = training_preflight(arguments.project, arguments.max_image_checks, arguments.check_packages,
                                 arguments.probe_imports, arguments.probe_tensorflow, arguments.check_duplicates)
    return report(arguments.project, results, arguments.format == "json")


def validate_project_config_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="validate_project_config.py",
        description="Validate PROJECT/project.json. Exit 0: valid, 1: invalid, 2: bad usage.")
    parser.add_argument("project", help="project directory (holds project.json)")
    parser.add_argument("--check-paths", action="store_true",
                        help="also check tags.txt, the database file and the images folder beside it")
    _add_format(parser)
    arguments = _parse(parser, argv)
    results = validate_project_config(arguments.project, arguments.check_paths)
    return report(arguments.project, results, arguments.format == "json")


def script(main) -> None:
    """Run a script entry point with the exit code it returns."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)

