"""K-fold scores: each post scored by a model trained, with the project's own recipe, on the other folds.

A fold is an ordinary project of its own under PROJECT/audit/folds/fold-I-of-K/: the project's
project.json (database_path pointed at the fold's database), tags.txt and categories.json, a
posts.sqlite holding the posts of the other folds (their rows as the project's database has them),
and an `images` link to the dataset's pictures. train-project's own entry trains it, so the recipe,
resume, --time-limit and the exports are the trainer's; the fold's export then scores the posts it
never saw. A fold whose scores are written is done; running the audit again resumes at the first
fold that is not (its training resumes from its checkpoint).

Which fold a post lands in depends only on (the project's seed, its split key): posts that
--group-duplicates made one group stay together, so no copy of a picture trains the model that
scores it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru.dataset.records import IMAGES_DIR, Records, read_only_uri
from deepdanbooru.errors import DatasetError, TrainingError, UserError, file_field
from deepdanbooru.fileio import create_beside, write_text_atomic
from deepdanbooru.project.categories import CATEGORIES_FILE
from deepdanbooru.project.config import PROJECT_FILE
from deepdanbooru.project.split import splitmix64
from deepdanbooru.project.tags import TAGS_FILE
from deepdanbooru.wording import plural

FOLD_DATABASE = "posts.sqlite"
STATE_FILE = "folds.json"
SCORES_FILE = "scores.npz"


def assign_folds(records: Records, folds: int, seed: int) -> np.ndarray:
    """The fold (0..folds-1) of each record: split keys in hashed order, dealt round-robin, so every
    fold gets its share and a group of duplicates one fold."""
    keys = np.asarray(records.split_keys, dtype=np.int64).view(np.uint64)
    unique = np.unique(keys)
    if not 2 <= folds <= len(unique):
        counted = plural(len(records), "eligible post")
        groups = "" if len(unique) == len(records) else f" in {len(unique):,} groups of duplicates"
        raise UserError(f"--folds {folds}: must be at least 2 and at most the number of posts ({counted}{groups})")
    with np.errstate(over="ignore"):
        hashed = splitmix64(splitmix64(np.uint64(seed & ((1 << 64) - 1))) ^ unique)
    fold_of_key = np.empty(len(unique), dtype=np.int64)
    fold_of_key[np.lexsort((unique, hashed))] = np.arange(len(unique)) % folds
    return fold_of_key[np.searchsorted(unique, keys)]


def records_fingerprint(records: Records) -> str:
    """What the folds were made from: the eligible ids and their tags (a change means new folds)."""
    digest = hashlib.sha256()
    for post_id, tag_string in zip(records.ids, records.tag_strings):
        digest.update(f"{post_id}\t{tag_string}\n".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Fold:
    index: int  # 0-based
    count: int
    directory: Path

    @property
    def name(self) -> str:
        return f"fold {self.index + 1} of {self.count}"

    @property
    def scores(self) -> Path:
        return self.directory / SCORES_FILE


def prepare_folds(audit_dir: Path, records: Records, folds: int, seed: int, tags: list[str], fold_of,
                  tags_path: Path) -> list[Fold]:
    """The fold folders (made once). The state records what the folds' models were made from: K, the seed,
    the posts, tags.txt (the models' outputs, in order) and each fold's post ids. An audit over other
    posts, folds or tags is refused in one line, before anything is written."""
    state_path = audit_dir / STATE_FILE
    ids = np.asarray(records.ids, dtype=np.int64)
    state = {"folds": folds, "seed": seed, "records": records_fingerprint(records), "tags": list(tags),
             "split": [ids[fold_of == index].tolist() for index in range(folds)]}
    if state_path.is_file():
        _check_state(state_path, state, audit_dir, tags_path)
    audit_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(state_path, json.dumps(state) + "\n")
    return [Fold(index, folds, audit_dir / "folds" / f"fold-{index + 1}-of-{folds}") for index in range(folds)]


def _check_state(state_path: Path, state: dict, audit_dir: Path, tags_path: Path) -> None:
    try:
        saved = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = None
    if saved == state:
        return
    anew = f"delete {audit_dir / 'folds'} and {state_path} to start anew"
    if not isinstance(saved, dict) or "tags" not in saved or "split" not in saved:
        raise TrainingError(file_field(state_path, None, (
            f"is not a fold state this audit can check (unreadable, or from an older version); {anew}")))
    if saved.get("tags") != state["tags"]:
        then, now = saved["tags"], state["tags"]
        raise TrainingError(file_field(tags_path, None, (
            f"is not the tags.txt the folds' models were trained with ({_tags_change(then, now)}); their scores "
            f"belong to those tags: put it back as it was, or {anew}")))
    if saved.get("folds") != state["folds"]:
        raise TrainingError(file_field(state_path, None, (
            f"an audit with --folds {saved.get('folds')} is under way; its folds do not fit --folds {state['folds']}: "
            f"give --folds {saved.get('folds')} to finish it, or {anew}")))
    if saved.get("split") == state["split"] and saved.get("seed") == state["seed"]:
        # The same posts in the same folds: their labels changed (an --apply, or edits), not what each model saw.
        raise TrainingError(file_field(state_path, None, (
            "the posts' tags changed since the folds were made (an --apply, or edits to the database): the folds' "
            f"models learnt the labels as they were, and the scores belong to them; {anew}")))
    raise TrainingError(file_field(state_path, None, (
        "the posts (their ids, tags or split) or the project's seed changed since the folds were made, so a fold's "
        f"model may have trained on a post it would score; {anew}")))


def _tags_change(then: list, now: list) -> str:
    before, after = set(then), set(now)
    added = [tag for tag in now if tag not in before]
    removed = [tag for tag in then if tag not in after]
    parts = [f"{len(then):,} tags then, {len(now):,} now"]
    if added:
        parts.append(f"added: {', '.join(added[:3])}{' ...' if len(added) > 3 else ''}")
    if removed:
        parts.append(f"removed: {', '.join(removed[:3])}{' ...' if len(removed) > 3 else ''}")
    if not added and not removed:
        parts.append("the same tags in another order")
    return "; ".join(parts)


def make_fold_project(fold: Fold, project_root: Path, raw_config: dict, config, training_ids) -> None:
    """The fold's project folder: the project's files, a database of the training posts, the pictures."""
    directory = fold.directory
    directory.mkdir(parents=True, exist_ok=True)
    fold_database = directory / FOLD_DATABASE
    database = config.require_database()
    if not fold_database.is_file():
        _copy_posts(database, fold_database, training_ids)
    images = directory / IMAGES_DIR
    if not images.exists():
        os.symlink(Path(database).resolve().parent / IMAGES_DIR, images, target_is_directory=True)
    # The project's paths, resolved from its folder: the fold's project.json lives elsewhere. A fold trains on
    # all its posts: the posts it holds out are its validation (they are scored, and their figures reported),
    # so holding back a validation_fraction as well would only take training posts away.
    fold_config = dict(raw_config, database_path=FOLD_DATABASE, validation_fraction=0.0)
    if config.backbone_weights is not None:
        fold_config["backbone_weights"] = str(Path(config.backbone_weights).resolve())
    write_text_atomic(directory / PROJECT_FILE, json.dumps(fold_config, indent=4) + "\n")
    for name in (TAGS_FILE, CATEGORIES_FILE):
        source = project_root / name
        if source.is_file():
            write_text_atomic(directory / name, source.read_text(encoding="utf-8"))


def _copy_posts(source: Path, target: Path, ids) -> None:
    """The posts rows of `ids`, every column as the source has it, written whole or not at all."""
    handle, temporary = create_beside(target)
    os.close(handle)
    try:
        connection = sqlite3.connect(temporary)
        try:
            connection.execute("ATTACH DATABASE ? AS source", (read_only_uri(source),))
        except sqlite3.OperationalError:
            connection.execute("ATTACH DATABASE ? AS source", (str(Path(source).resolve()),))
        schema = connection.execute("SELECT sql FROM source.sqlite_master WHERE type = 'table' AND name = 'posts'")
        connection.execute(schema.fetchone()[0])
        connection.execute("CREATE TEMP TABLE wanted (id INTEGER PRIMARY KEY)")
        connection.executemany("INSERT INTO wanted VALUES (?)", ((int(post_id),) for post_id in ids))
        connection.execute("INSERT INTO main.posts SELECT * FROM source.posts WHERE id IN (SELECT id FROM wanted)")
        connection.commit()
        connection.close()
        os.replace(temporary, target)
    except sqlite3.DatabaseError as error:
        raise DatasetError(file_field(source, "posts", f"cannot be copied into {target}: {error}")) from None
    finally:
        if temporary.exists():
            temporary.unlink()


@dataclass(frozen=True)
class FoldScores:
    ids: np.ndarray  # the post ids the fold scored
    scores: np.ndarray  # (posts, tags of tags.txt)
    trained: dict  # how far its model trained: epochs, planned, stopped (by --time-limit), seconds


def read_fold_scores(fold: Fold) -> FoldScores | None:
    """What a finished fold wrote; None while it is not done."""
    if not fold.scores.is_file():
        return None
    try:
        with np.load(fold.scores) as saved:
            trained = json.loads(str(saved["trained"])) if "trained" in saved.files else {}
            return FoldScores(saved["ids"], saved["scores"], trained)
    # A damaged zip is BadZipFile and an empty file EOFError, neither an OSError nor a ValueError.
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise TrainingError(file_field(fold.scores, None, (
            f"cannot be read ({error}); delete it and run the audit again to score the fold anew"))) from None


def write_fold_scores(fold: Fold, ids, scores, trained: dict) -> None:
    save_arrays(fold.scores, ids=np.asarray(ids, dtype=np.int64), scores=np.asarray(scores, dtype=np.float32),
                trained=np.asarray(json.dumps(trained)))


def save_arrays(path: Path, **arrays) -> None:
    """np.savez written beside `path` and renamed over it: an error or Ctrl-C mid-write leaves the file as it was."""
    handle, temporary = create_beside(path)
    os.close(handle)
    try:
        with open(temporary, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


STOP_LINE = "Stopped for the time limit"
VALIDATION_OFF = "Validation: off."


class TrainingWatch:
    """Passes train-project's lines on, except two whose advice does not fit a fold: its time-limit stop (a
    fold is not resumed by running train-project again; the audit gives its own advice, describe_training)
    and "Validation: off" (a fold trains on all its posts by design: the fold it scores is its validation)."""

    def __init__(self, echo):
        self.echo = echo
        self.stopped = False
        self.planned = None

    def __call__(self, line) -> None:
        text = str(line)
        if text.startswith(VALIDATION_OFF):  # its advice (set validation_fraction) would not apply to a fold
            self.echo("Validation: the fold's own posts, scored after training (it trains on all the others)")
            return
        if text.startswith(STOP_LINE):
            self.stopped = True
            found = re.search(r"at epoch (\d+)/(\d+)", text)
            self.planned = int(found.group(2)) if found else None
            return
        self.echo(line)

    def trained(self, counters, train_records: int, seconds: float) -> dict:
        """How far the fold's model trained, from the trainer's final counters."""
        epochs = counters.used_epoch + (counters.offset / train_records if train_records else 0.0)
        planned = self.planned if self.stopped else counters.used_epoch
        return {"epochs": round(float(epochs), 3), "planned": planned, "stopped": self.stopped,
                "seconds": round(float(seconds), 1)}


def describe_training(name: str, trained: dict) -> str:
    """'fold 1 of 3 trained 1.2 of 200 epochs (stopped by --time-limit after 1m30s)'."""
    if not trained:
        return f"{name}: how far it trained was not recorded (scored by an older version)"
    epochs, planned = trained.get("epochs"), trained.get("planned")
    of = f" of {planned}" if planned is not None and trained.get("stopped") else ""
    how = (f" (stopped by --time-limit after {format_seconds(trained.get('seconds', 0))})" if trained.get("stopped")
           else " (its plan done)")
    return f"{name} trained {epochs:g}{of} epoch{'' if epochs == 1 and not of else 's'}{how}"


def short_training(trained: dict) -> bool:
    """A fold stopped by the time limit before half its planned epochs."""
    planned = trained.get("planned")
    return bool(trained.get("stopped")) and planned is not None and trained.get("epochs", 0) < 0.5 * planned


class FoldClock:
    """The audit's ETA: the folds still to train at the pace of those trained in this run (or, before
    the first, at most the --time-limit each)."""

    def __init__(self, time_limit: float | None, clock=time.monotonic):
        self.time_limit = time_limit
        self.clock = clock
        self.took: list[float] = []
        self.started = None

    def start(self) -> None:
        self.started = self.clock()

    def done(self) -> float:
        seconds = self.clock() - self.started
        self.took.append(seconds)
        return seconds

    def remaining(self, folds_left: int) -> str:
        if folds_left <= 0:
            return "none"
        if self.took:
            return f"about {format_seconds(folds_left * sum(self.took) / len(self.took))}"
        if self.time_limit is not None:
            return f"at most about {format_seconds(folds_left * self.time_limit)} (--time-limit each)"
        return "unknown until the first fold is trained"


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
