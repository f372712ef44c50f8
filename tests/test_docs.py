"""The documentation cannot drift from the code."""

import re
from pathlib import Path

from deepdanbooru.cli import main
from deepdanbooru.project.config import KEYS
from deepdanbooru.project.reference import render

ROOT = Path(__file__).resolve().parents[1]


def test_project_json_reference_is_generated_from_the_key_table():
    text = (ROOT / "docs" / "project-json.md").read_text(encoding="utf-8")
    assert text == render(), "regenerate: python -m deepdanbooru.project.reference > docs/project-json.md"
    for key in KEYS:
        assert f"| `{key.name}`" in text


def test_every_command_is_documented():
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    missing = [name for name in main.commands if not re.search(rf"\b{re.escape(name)}\b", docs)]
    assert not missing, f"commands without documentation: {missing}"
