"""audit.csv, what a person acts on, and audit/audit.json, what the audit saw (standard library only).

audit.csv: post_id,md5,tag,given,score,kind,rank,probability. given: 1 if the post carries the tag;
kind: `missing` (the post lacks the tag) or `wrong` (the post carries it); score: the out-of-sample
model's score for the tag on that post; probability: the audit's estimate that the given label is a
mistake (ranking.py); rank 1: the label most likely a mistake. A file of accepted suggestions has the
same columns: a copy of audit.csv with the rejected rows deleted will do (a file of an audit that wrote
no probability column is read too).

audit.json records, for each post with a suggestion, its md5, its tags as the audit read them and
the tags it suggested, with the project and database: applying a file checks its rows against it,
so a file from another project or database, or a database edited since, is refused before anything
is written.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import UserError, file_field
from deepdanbooru.fileio import write_text_atomic

COLUMNS = ("post_id", "md5", "tag", "given", "score", "kind", "rank", "probability")
OLD_COLUMNS = COLUMNS[:-1]  # an audit's file from before the probability
KINDS = {0: "missing", 1: "wrong"}  # by `given`
AUDIT_CSV = "audit.csv"
AUDIT_JSON = "audit.json"
AUDIT_DIR = "audit"
VERSION = 1


@dataclass(frozen=True)
class Suggestion:
    post_id: int
    md5: str
    tag: str
    given: int
    score: float
    rank: int
    probability: float | None = None  # estimated probability that the given label is wrong (0..1)

    @property
    def kind(self) -> str:
        return KINDS[self.given]

    def row(self) -> list:
        probability = "" if self.probability is None else f"{self.probability:.4f}"
        return [self.post_id, self.md5, self.tag, self.given, f"{self.score:.4f}", self.kind, self.rank, probability]

    def record(self) -> dict:
        """The row as audit.json's rows hold it."""
        return {"rank": self.rank, "post_id": self.post_id, "tag": self.tag, "given": self.given, "kind": self.kind,
                "score": round(float(self.score), 4),
                "probability": None if self.probability is None else round(float(self.probability), 4)}


def csv_text(suggestions) -> str:
    stream = io.StringIO()
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(suggestion.row() for suggestion in suggestions)
    return stream.getvalue()


def write_results(project_root: Path, suggestions: list[Suggestion], posts: dict, database: Path,
                  source: str, audited_tags: list[str], summary: dict | None = None) -> tuple[Path, Path]:
    """audit/audit.json first, then audit.csv: a csv on disk always has its record. `summary`: what the
    audit found about its models and the labels (estimated errors, validation figures, skipped tags)."""
    record = {
        "version": VERSION,
        "project": str(Path(project_root).resolve()),
        "database": str(Path(database).resolve()),
        "source": source,
        "audited_tags": audited_tags,
        **(summary or {}),
        "rows": [suggestion.record() for suggestion in suggestions],
        "posts": {str(post_id): posts[post_id] for post_id in sorted({s.post_id for s in suggestions})},
    }
    for suggestion in suggestions:
        record["posts"][str(suggestion.post_id)].setdefault("suggested", []).append(suggestion.tag)
    json_path = Path(project_root) / AUDIT_DIR / AUDIT_JSON
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json_path, json.dumps(record, indent=1) + "\n")
    csv_path = Path(project_root) / AUDIT_CSV
    write_text_atomic(csv_path, csv_text(suggestions))
    return csv_path, json_path


def read_record(project_root: Path) -> dict:
    path = Path(project_root) / AUDIT_DIR / AUDIT_JSON
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(file_field(path, None, "not found: run `deepdanbooru audit` on the project first")) from None
    except (OSError, ValueError) as error:
        raise UserError(file_field(path, None, f"cannot be read: {error}")) from None
    if not isinstance(record, dict) or record.get("version") != VERSION or not isinstance(record.get("posts"), dict):
        raise UserError(file_field(path, None, "is not an audit record of this version; run the audit again"))
    for key in ("project", "database"):
        if not isinstance(record.get(key), str):
            raise UserError(file_field(path, key, "missing or not a path (a damaged record?); run the audit again"))
    for post_id, post in record["posts"].items():
        problem = _post_problem(post_id, post)
        if problem:
            raise UserError(file_field(path, f"posts.{post_id}", f"{problem} (a damaged record?); run the audit again"))
    return record


def _post_problem(post_id: str, post) -> str | None:
    """What is wrong with one post of a record as write_results writes it, or None."""
    if not post_id.isdigit():
        return "not a post id"
    if not isinstance(post, dict):
        return "not an object"
    for key in ("md5", "tags"):
        if not isinstance(post.get(key), str):
            return f"{key}: missing or not text"
    suggested = post.get("suggested")
    if not isinstance(suggested, list) or not suggested or not all(isinstance(tag, str) for tag in suggested):
        return "suggested: missing or not a list of tags"
    return None


def read_suggestions(path) -> list[tuple[int, Suggestion]]:
    """An apply file's (line number, row) pairs (audit.csv's columns); one line naming the row for anything else."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(file_field(path, None, "not found")) from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(file_field(path, None, f"cannot be read: {error}")) from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    columns = tuple(name.strip() for name in header) if header is not None else None
    if columns not in (COLUMNS, OLD_COLUMNS):
        raise UserError(file_field(path, "header", f"must be {','.join(COLUMNS)} (audit.csv's columns)"))
    rows = []
    for line, row in enumerate(reader, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise UserError(file_field(path, f"line {line}", f"has {len(row)} fields, not {len(columns)}"))
        post_id, md5, tag, given, score, kind, rank, *rest = (cell.strip() for cell in row)
        probability = rest[0] if rest else ""
        try:
            suggestion = Suggestion(int(post_id), md5, tag, int(given), float(score), int(rank),
                                    float(probability) if probability else None)
        except ValueError:
            raise UserError(file_field(path, f"line {line}", "post_id, given and rank must be integers, score "
                                                             "a number and probability a number or empty")) from None
        numbers_ok = 0.0 <= suggestion.score <= 1.0 and (probability == "" or 0.0 <= suggestion.probability <= 1.0)
        if not numbers_ok or suggestion.rank < 1:  # NaN fails the range tests too
            raise UserError(file_field(path, f"line {line}", f"score {score} and probability {probability or '-'} "
                                                             f"must be numbers from 0 to 1 and rank {rank} a whole "
                                                             "number from 1, as audit.csv writes them"))
        if suggestion.given not in KINDS or KINDS[suggestion.given] != kind:
            raise UserError(file_field(path, f"line {line}", f"given {given} with kind {kind!r}: a missing tag has "
                                                             "given 0, a wrong one given 1"))
        rows.append((line, suggestion))
    return rows
