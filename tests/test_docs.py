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


def _texts():
    for folder in ("deepdanbooru", "docs", "tests", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md") and path.is_file():
                yield path, path.read_text(encoding="utf-8")
    yield ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8")


def test_no_text_cites_what_the_repository_lacks():
    # A reader can follow neither an issue number nor a document kept outside the repository.
    # Spelled in pieces so that this line does not cite them itself.
    notes = "|".join(prefix + "_NOTES" for prefix in ("TF", "WD"))
    outside = re.compile(r"\bSPEC\b|" + notes + r"|DESIGN\.md|\b[Ii]ssue" + r" \d+")
    cited = re.compile(r"\b(?:docs|bench|scripts|tests|deepdanbooru)/[\w./-]+\.(?:md|py)\b")
    found = []
    for path, text in _texts():
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in outside.finditer(text)]
        found += [f"{path.relative_to(ROOT)}: {m.group(0)} (missing)" for m in cited.finditer(text)
                  if not (ROOT / m.group(0)).exists()]
    assert found == []
