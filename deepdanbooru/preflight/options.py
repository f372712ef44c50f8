"""Preflight's command-line options, one table for `deepdanbooru preflight` (click) and the scripts (argparse)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_IMAGE_CHECKS = 20


@dataclass(frozen=True)
class Option:
    """One command-line option, shared by `deepdanbooru preflight` (click) and the scripts (argparse)."""

    flag: str
    help: str
    default: int | None = None  # an option taking N >= 0; None for an on/off flag
    dest: str | None = None  # the parameter name, when it is not the flag's

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


JSON_OPTION = Option("--json", "Print one JSON object instead of lines.", dest="as_json")
PREFLIGHT_OPTIONS = (
    Option("--max-image-checks", "Check the first N eligible images by id; 0 checks all.",
           default=DEFAULT_MAX_IMAGE_CHECKS),
    Option("--check-packages", "Check installed versions of the runtime packages (no import)."),
    Option("--probe-imports", "Import each runtime package in a child process and report its version."),
    Option("--probe-tensorflow", "Run TensorFlow in a child process: compute on the CPU, decode the sampled images."),
    Option("--check-duplicates", "Read every eligible image: identical files and near-identical pictures (dHash, "
                                 "needs Pillow) on both sides of the validation split."),
    JSON_OPTION,
)
VALIDATE_OPTIONS = (
    Option("--check-paths", "Also check tags.txt, the database file and the images folder beside it."),
    JSON_OPTION,
)
