"""Preflight's command-line options, one table for `deepdanbooru preflight` (click) and the scripts (argparse)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_IMAGE_CHECKS = 20


@dataclass(frozen=True)
class Option:
    """One command-line option, shared by `deepdanbooru preflight` (click) and the scripts (argparse)."""

    flag: str
    help: str
    default: int | str | None = None  # N >= 0, or one of `choices`; None for an on/off flag
    dest: str | None = None  # the parameter name, when it is not the flag's
    choices: tuple[str, ...] = ()  # a word option takes one of these
    alias: tuple[str, str] | None = None  # (older flag, the choice it stands for): accepted, not shown
    metavar: str | None = None  # a value option taking a path (a file or folder), named so in the help

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


# --format is the CLI's name for output formats; --json is the spelling the scripts had first.
FORMAT_OPTION = Option("--format", "text: one line per check; json: one JSON object.", default="text",
                       dest="output_format", choices=("text", "json"), alias=("--json", "json"))
PREFLIGHT_OPTIONS = (
    Option("--max-image-checks", "Check the first N eligible images by id; 0 checks all.",
           default=DEFAULT_MAX_IMAGE_CHECKS),
    Option("--check-packages", "Check installed versions of the runtime packages (no import)."),
    Option("--probe-imports", "Import each runtime package in a child process and report its version."),
    Option("--probe-tensorflow", "Run TensorFlow in a child process: compute on the CPU, decode the sampled images."),
    Option("--check-duplicates", "Read every eligible image: identical files and near-identical pictures (dHash, "
                                 "needs Pillow) on both sides of the validation split."),
    Option("--source-model", "The --source-model train-project will start from: the model check names the network "
                             "that trains (the source's, not project.json's model) and its size.", metavar="PATH"),
    FORMAT_OPTION,
)
VALIDATE_OPTIONS = (
    Option("--check-paths", "Also check tags.txt, the database file and the images folder beside it."),
    FORMAT_OPTION,
)
