"""What a run wrote, read for the page (standard library only).

Each file is optional: a project trained by DeepDanbooru 1.0 has none of logs/, a run without validation
has no best.json. A file that exists but cannot be parsed stops the report with one line naming it, since
a page drawn from half a history would mislead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import UserError, file_field, json_error_text

VOCABULARY_FILE = "vocabulary.txt"
SOURCE_AP_FILE = "source_tag_ap.json"
STATE_FILE = "state.json"


@dataclass
class RunFiles:
    history: list[dict] = field(default_factory=list)
    best: dict | None = None
    state: dict | None = None
    vocabulary: list[tuple[str, str]] | None = None  # (kept | new | dropped, tag)
    source_ap: dict | None = None
    read: list[Path] = field(default_factory=list)  # the files found, for the page's list of sources

    @property
    def train_rows(self) -> list[dict]:
        return [row for row in self.history if row.get("kind") == "train"]

    @property
    def validation_rows(self) -> list[dict]:
        return [row for row in self.history if row.get("kind") == "validation"]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(file_field(path, None, f"cannot be read: {error}")) from None
    except json.JSONDecodeError as error:
        raise UserError(file_field(path, None, json_error_text(error))) from None


def read_history(path: Path) -> list[dict]:
    """Every complete object of logs/history.jsonl; a torn last line (a kill mid-write) is left out, as the
    trainer itself drops it on resume."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(file_field(path, None, f"cannot be read: {error}")) from None
    lines = text.splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) and not line.endswith("\n"):
                break
            raise UserError(file_field(path, f"line {number}", "is not a JSON object")) from None
        if not isinstance(row, dict):
            raise UserError(file_field(path, f"line {number}", "is not a JSON object"))
        rows.append(row)
    return rows


def read_vocabulary(path: Path) -> list[tuple[str, str]]:
    """logs/vocabulary.txt: `kept|new|dropped<TAB>tag[<TAB>source spelling]` lines after a # comment."""
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 2 or parts[0] not in ("kept", "new", "dropped"):
            raise UserError(file_field(path, f"line {number}", "expected kept, new or dropped, a tab, then a tag"))
        entries.append((parts[0], parts[1]))
    return entries


def best_json(project_dir: Path, model: str) -> Path:
    return project_dir / f"model-{model}.best.json"


def read_run_files(project_dir: Path, model: str) -> RunFiles:
    project_dir = Path(project_dir)
    files = RunFiles()
    logs, checkpoints = project_dir / "logs", project_dir / "checkpoints"
    history = logs / "history.jsonl"
    if history.is_file():
        files.history = read_history(history)
        files.read.append(history)
    for name, path in (("best", best_json(project_dir, model)), ("state", checkpoints / STATE_FILE),
                       ("source_ap", logs / SOURCE_AP_FILE)):
        if path.is_file():
            payload = _read_json(path)
            if not isinstance(payload, dict):
                raise UserError(file_field(path, None, "is not a JSON object"))
            setattr(files, name, payload)
            files.read.append(path)
    vocabulary = logs / VOCABULARY_FILE
    if vocabulary.is_file():
        files.vocabulary = read_vocabulary(vocabulary)
        files.read.append(vocabulary)
    return files
