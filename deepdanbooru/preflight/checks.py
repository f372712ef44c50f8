"""The project checks of preflight: read-only, standard library only.

Each check takes the shared run state and returns one CheckResult. A check
that needs something an earlier check could not provide (a valid config, an
open database) is skipped, not failed twice: the earlier FAIL already names
the cause.
"""

from __future__ import annotations

import re
import sqlite3
import warnings
from collections import Counter
from pathlib import Path

from deepdanbooru.dataset import duplicates, records
from deepdanbooru.dataset.trust import MIN_TRAIN_POSITIVES, split_stats, trust_warning
from deepdanbooru.errors import UserError
from deepdanbooru.formats import stored_extensions
from deepdanbooru.models import table
from deepdanbooru.models.sourceinfo import source_network
from deepdanbooru.preflight.images import BadImage, inspect_image, too_large
from deepdanbooru.preflight.options import DEFAULT_MAX_IMAGE_CHECKS
from deepdanbooru.preflight.results import FAIL, PASS, SKIP, WARN, CheckResult
from deepdanbooru.project.config import FIT, load_config
from deepdanbooru.project.paths import ProjectPaths, safe_export_name
from deepdanbooru.project.resume import (START_FILE, describe_resume_point, fine_tuned_network, has_checkpoint,
                                         recorded_start, resume_point)
from deepdanbooru.project.shards import SHARDS_DIR, scoring_shards, training_shards
from deepdanbooru.project.split import in_validation
from deepdanbooru.project.tags import load_tags, tags_hash
from deepdanbooru.runstate.lock import owner_is_stale, read_owner
from deepdanbooru.runstate.state import STATE_FILE, read_state_json

SHOWN_PROBLEMS = 3  # a FAIL line names this many bad rows, then counts the rest


class _Skip(Exception):
    pass


class Run:
    """What the checks learn and share; filled in check by check."""

    def __init__(self, project, max_image_checks: int = DEFAULT_MAX_IMAGE_CHECKS, check_duplicates: bool = False,
                 max_distance: int = duplicates.DEFAULT_MAX_DISTANCE, source_model=None):
        self.paths = ProjectPaths(project)
        self.source_model = source_model  # the --source-model train-project will be given, when told
        self.max_image_checks = max_image_checks
        self.check_duplicates = check_duplicates  # read every eligible image (file MD5 and dHash)
        self.max_distance = max_distance
        self.config = None
        self.tags = None
        self.connection: sqlite3.Connection | None = None
        self.eligible = 0
        self.sample: list[tuple] = []  # (id, md5, file_ext, tag_string), id order
        self.image_paths: list[tuple[int, str, object]] = []  # (id, path, ImageInfo) of readable sampled images
        self.rows_usable = False  # every eligible row has an integer id and a safe md5 (the md5 check passed)
        self.shards = None  # project.shards.ShardIndex when train-project will read the packed pictures
        self.validation_shards = None  # the same for the validation pictures (the shards' validation part)

    def need(self, what: str):
        value = getattr(self, what)
        if value is None:
            raise _Skip({"config": "needs a valid project.json",
                         "tags": "needs a valid tags.txt",
                         "connection": "needs a readable posts table"}[what])
        return value

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def run_checks(run: Run, checks) -> list[CheckResult]:
    results = []
    for name, check in checks:
        items = ()
        try:
            status, detail, *listed = check(run)
            items = tuple(listed[0]) if listed else ()
        except _Skip as skip:
            status, detail = SKIP, str(skip)
        except UserError as error:
            status, detail = FAIL, str(error)
        except sqlite3.DatabaseError as error:
            status, detail = FAIL, f"{run.paths.root}: database error: {error}"
        results.append(CheckResult(name, status, detail, items))
    return results


# --- config and tags ------------------------------------------------------------


def check_config(run: Run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.config = load_config(run.paths.root)
    config = run.config
    detail = (f"{config.config_path}: model {config.model}, input {config.image_height}x{config.image_width}x3, "
              f"minibatch {config.minibatch_size}, {_epochs(config.epoch_count)}")
    notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if notes:
        return WARN, detail + "; " + "; ".join(notes)
    return PASS, detail


def check_tags(run: Run):
    run.tags = load_tags(run.paths.tags)
    return PASS, f"{run.paths.tags}: {len(run.tags)} tags"


def check_model(run: Run):
    """The model takes this input, and how big it is, before anyone waits for TensorFlow to build it."""
    config = run.need("config")
    recorded = fine_tuned_network(run.paths.checkpoints)
    if recorded is not None:
        # Resuming rebuilds the checkpoint's network, whatever project.json's model says.
        counts = recorded["parameters"]
        exports = run.paths.final_export(run.paths.export_name(config.model)).name
        return PASS, (f"{recorded['network']} (fine-tuned from --source-model {recorded['source']}, as the "
                      f"checkpoint records it, exported as {exports}; the source's network trains, not one built "
                      f"from project.json's model {config.model}): "
                      f"input {config.image_height}x{config.image_width}x3, "
                      f"{counts['trainable']:,} trainable and {counts['non_trainable']:,} non-trainable parameters")
    source = _fresh_source(run)
    if source is not None:
        return _source_model_line(run, config, *source)
    table.check_model_input(config.model, config.input_shape, config.config_path)
    table.check_head_bias_init(config.model, config.head_bias_init, config.config_path)
    if run.tags is None:
        return PASS, f"{config.model} accepts input {config.image_height}x{config.image_width}x3"
    trainable, frozen = table.parameter_counts(config.model, config.input_shape, len(run.tags))
    return PASS, (f"{config.model}: input {config.image_height}x{config.image_width}x3, {len(run.tags)} outputs, "
                  f"{trainable:,} trainable and {frozen:,} non-trainable parameters")


def _fresh_source(run: Run) -> tuple[Path, str] | None:
    """(source, how preflight knows it) for a run that will start from a --source-model: --source-model given to
    preflight, else the one a stopped run started from (checkpoints/start.json); None without either."""
    if has_checkpoint(run.paths.checkpoints):
        return None
    if run.source_model is not None:
        return Path(run.source_model), "--source-model"
    try:
        started = recorded_start(run.paths.checkpoints)
    except UserError:
        return None  # the checkpoint check names the unreadable record
    if started is not None:
        return Path(started[0]), f"--source-model {started[0]}, which the stopped run started from"
    return None


def _source_model_line(run: Run, config, source: Path, given: str):
    if not source.exists():
        return FAIL, f"{source}: --source-model not found"
    resampled = (config.image_height, config.image_width) if config.resample_positions else None
    try:
        network = source_network(source, len(run.tags) if run.tags is not None else None, resampled)
    except UserError as error:
        return FAIL, str(error)
    name = network.name or f"the network in {source.name}"
    exports = run.paths.final_export(safe_export_name(network.name or "") or config.model).name
    text = (f"{name} (the network of {given if given != '--source-model' else f'--source-model {source}'}, "
            f"exported as {exports}; the source's network trains, not one built from project.json's model "
            f"{config.model}): input {config.image_height}x{config.image_width}x3")
    if network.parameters is not None:
        mapped = f", its head mapped onto {len(run.tags):,} tags" if run.tags is not None else ""
        return PASS, f"{text}, {network.parameters:,} parameters in the checkpoint's tensors{mapped}"
    return PASS, f"{text}; train-project counts its parameters when it builds it"


def check_paths(run: Run):
    """validate_project_config --check-paths: the files project.json points at exist."""
    config = run.need("config")
    database = config.require_database()
    records.connect_read_only(database).close()
    images = database.parent / records.IMAGES_DIR
    if not images.is_dir():
        return FAIL, f"{images}: images folder not found beside the database"
    # Read only when a run starts from scratch; a resumed run does not need the file.
    if not has_checkpoint(run.paths.checkpoints):
        config.require_backbone_weights()
    return PASS, f"database {database} and images folder {images} exist"


# --- database -------------------------------------------------------------------


def check_database(run: Run):
    config = run.need("config")
    database = config.require_database()
    connection = records.connect_read_only(database)
    try:
        columns = records.check_posts_table(connection, database)
    except (UserError, sqlite3.DatabaseError):
        connection.close()
        raise
    run.connection = connection
    optional = [c for c in ("rating", "score", "is_deleted") if c not in columns]
    detail = f"{database}: posts table has {', '.join(records.REQUIRED_COLUMNS)}"
    if optional:
        detail += f" (no {', '.join(optional)}: make-training-database will not filter on them)"
    return PASS, detail


def check_eligible(run: Run):
    config = run.need("config")
    connection = run.need("connection")
    extensions = config.image_extensions
    rule = f"file_ext in ({', '.join(extensions)}) and tag_count_general >= {config.minimum_tag_count}"
    run.eligible = records.count_eligible(connection, config.minimum_tag_count, extensions)
    total = connection.execute("SELECT COUNT(*) FROM posts").fetchone()[0]
    if run.eligible == 0:
        marks = ", ".join("?" for _ in extensions)
        with_ext = connection.execute(f"SELECT COUNT(*) FROM posts WHERE file_ext IN ({marks})",
                                      extensions).fetchone()[0]
        return FAIL, (f"{config.database_path}: no eligible posts ({rule}): {total:,} posts, "
                      f"{with_ext:,} with an eligible file_ext, none of them with enough tags; "
                      "lower minimum_tag_count or widen image_extensions in project.json")
    limit = run.max_image_checks or None
    sql = records.eligible_query(extensions, limit=limit)
    run.sample = connection.execute(sql, (*extensions, config.minimum_tag_count)).fetchall()
    return PASS, f"{run.eligible:,} eligible posts of {total:,} ({rule})"


def _unsafe_row(row_id, md5) -> int:
    if not isinstance(row_id, int):
        return 1
    try:
        records.check_md5(md5, row_id, "")
    except UserError:
        return 1
    return 0


def check_md5(run: Run):
    """Every eligible row, not just the sample: one unsafe md5 stops training, wherever it is."""
    config = run.need("config")
    connection = run.need("connection")
    if not run.eligible:
        raise _Skip("no eligible posts")
    connection.create_function("deepdanbooru_unsafe_row", 2, _unsafe_row, deterministic=True)
    sql = records.eligible_query(config.image_extensions, "COUNT(*), MIN(id)",
                                 also="deepdanbooru_unsafe_row(id, md5)", ordered=False)
    bad, first = connection.execute(sql, (*config.image_extensions, config.minimum_tag_count)).fetchone()
    if not bad:
        run.rows_usable = True
        return PASS, f"all {run.eligible:,} eligible posts have an integer id and a safe md5 file name"
    md5 = connection.execute("SELECT md5 FROM posts WHERE id = ?", (first,)).fetchone()
    try:
        records.check_md5(md5[0] if md5 else None, first, config.database_path)
    except UserError as error:
        reason = str(error)
    else:
        reason = f"{config.database_path}: posts id {first!r} is not an integer"
    return FAIL, f"{bad:,} eligible post(s) unusable; first: {reason}"


# --- packed shards and images -----------------------------------------------------


def check_shards(run: Run):
    """Whether train-project reads the training pictures from PROJECT/shards, by train-project's own rule."""
    config = run.need("config")
    directory = run.paths.root / SHARDS_DIR
    if not directory.is_dir():
        return PASS, f"no {directory}: train-project reads the original image files"
    run.need("tags")
    run.need("connection")
    if not run.eligible:
        raise _Skip("no eligible posts")
    if not run.rows_usable:
        raise _Skip("needs every eligible post usable (see md5)")
    eligible = records.load_records(config.database_path, config.minimum_tag_count, config.image_extensions)
    run.shards = training_shards(run.paths.root, config, run.paths.tags, eligible)
    if run.shards is None:
        return PASS, f"{directory} is empty: train-project reads the original image files"
    fraction, seed = config.validation_fraction, config.seed
    validation = eligible.subset([i for i, key in enumerate(eligible.split_keys)
                                  if in_validation(int(key), fraction, seed)])
    run.validation_shards, notice = scoring_shards(run.paths.root, config, validation,
                                                   (config.image_height, config.image_width))
    if run.validation_shards is not None and len(validation):
        scored = f"validation reads its {len(validation):,} pictures from the validation part"
    else:
        scored = notice.removeprefix("notice: ") if notice and len(validation) \
            else "validation reads the original files"
    detail = (f"train-project will read the training pictures from {directory} ({len(run.shards.locations):,} "
              f"packed in {len(run.shards.files)} shard(s), {len(run.shards.bad):,} could not be packed); {scored}")
    warned = run.shards.warnings()
    if warned:
        return WARN, f"{detail}; " + "; ".join(warned)
    return PASS, detail


def _packed_reason(run: Run, split, row_id, path: str):
    """(True, why the shards cannot give it, or None) for a post training reads from the shards; else (False, None)."""
    if run.shards is None:
        return False, None
    if in_validation(split.get(row_id, row_id), run.config.validation_fraction, run.config.seed):
        part = run.validation_shards
        return (False, None) if part is None else (True, part.known_reason(path))
    return True, run.shards.known_reason(path)


def check_images(run: Run):
    config = run.need("config")
    connection = run.need("connection")
    if not run.sample:
        raise _Skip("no eligible posts")
    images = config.database_path.parent / records.IMAGES_DIR
    if run.shards is None and not images.is_dir():
        return FAIL, f"{images}: images folder not found beside the database"
    split = records.split_keys(connection, config.database_path) if run.shards is not None else {}
    bad, mismatched = [], []
    formats, sizes = Counter(), set()
    checked = packed = 0
    # With shards, only validation posts outside a usable validation part are read from their files: say so,
    # or a deleted original puzzles.
    original = " (a validation post: validation reads its original file)" if run.shards is not None else ""
    for row_id, md5, ext, _ in run.sample:
        if _unsafe_row(row_id, md5):
            continue  # named by the md5 check; never turned into a path
        checked += 1
        path = records.image_path(images, md5, ext)
        from_shards, reason = _packed_reason(run, split, row_id, path)
        if from_shards:
            # The original file is not read for training, so a deleted original is no problem.
            if reason:
                bad.append(f"id {row_id} {path}: {reason}")
            else:
                packed += 1
            continue
        try:
            info = inspect_image(path)
        except BadImage as error:
            bad.append(f"id {row_id} {path}: {error.reason}{original}")
            continue
        if info.pixels > config.max_image_pixels:
            bad.append(f"id {row_id} {path}: {too_large(info, config.max_image_pixels)}{original}")
            continue
        # A mismatch still decodes, but deserves a word.
        if str(ext).lower() not in stored_extensions(info.format):
            mismatched.append(f"id {row_id} {path} holds {info.format.upper()}")
        formats[info.format] += 1
        sizes.add((info.width, info.height))
        run.image_paths.append((row_id, path, info))
    sampled = len(run.sample)
    scope = (f"all {run.eligible:,} eligible images" if sampled == run.eligible
             else f"the first {sampled:,} of {run.eligible:,} eligible images (by id)")
    if bad:
        return FAIL, f"{len(bad)} unusable among {scope}: {_first(bad)}", bad
    if not checked:
        raise _Skip("no sampled post has a safe md5")
    found = []
    if packed:
        found.append(f"{packed:,} picture(s) packed in {run.shards.directory} (train-project reads them "
                     "from there, not from the original files)")
    if sizes:
        smallest, largest = min(sizes, key=lambda s: s[0] * s[1]), max(sizes, key=lambda s: s[0] * s[1])
        found.append(", ".join(f"{name} {n}" for name, n in sorted(formats.items()))
                     + f"; {smallest[0]}x{smallest[1]}"
                     + ("" if smallest == largest else f" to {largest[0]}x{largest[1]}"))
    summary = f"checked {scope}: " + "; ".join(found)
    if mismatched:
        return (WARN, summary + f"; {len(mismatched)} whose extension does not match the content: "
                f"{_first(mismatched)}", mismatched)
    return PASS, summary


def check_labels(run: Run):
    tags = set(run.need("tags"))
    run.need("config")
    if not run.sample:
        raise _Skip("no eligible posts")
    empty = [row[0] for row in run.sample if not tags.intersection((row[3] or "").split())]
    used = {tag for row in run.sample for tag in (row[3] or "").split()} & tags
    detail = f"{len(run.sample)} sampled posts use {len(used)} of {len(tags)} tags of tags.txt"
    if empty:
        ids = ", ".join(str(i) for i in empty[:SHOWN_PROBLEMS])
        return WARN, (f"{detail}; {len(empty)} have no tag from tags.txt and train as all-negative "
                      f"(ids {ids}{', ...' if len(empty) > SHOWN_PROBLEMS else ''})")
    return PASS, detail


def check_split(run: Run):
    """What train-project warns about at its start: a split that cannot measure the model."""
    config = run.need("config")
    tags = run.need("tags")
    connection = run.need("connection")
    if not run.eligible:
        raise _Skip("no eligible posts")
    sql = records.eligible_query(config.image_extensions, "id, tag_string", ordered=False)
    rows = connection.execute(sql, (*config.image_extensions, config.minimum_tag_count))
    split_keys = records.split_keys(connection, config.database_path)  # posts.split_id, where set
    fraction, seed = config.validation_fraction, config.seed
    stats = split_stats(((in_validation(split_keys.get(row_id, row_id), fraction, seed), tag_string or "")
                         for row_id, tag_string in rows if isinstance(row_id, int)), tags)
    warning = trust_warning(stats, config.validation_fraction, config.config_path)
    detail = (f"{stats.train_posts:,} training and {stats.validation_posts:,} validation posts "
              f"(validation_fraction {config.validation_fraction:g})")
    if warning:
        return WARN, f"{detail}; {warning}"
    return PASS, f"{detail}; every tag has {MIN_TRAIN_POSITIVES} or more training positives"


def _first(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    return shown + (f"; and {more} more (--format json lists every one)" if more > 0 else "")


# --- training state -------------------------------------------------------------

_LATEST = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.MULTILINE)


def check_checkpoint(run: Run):
    directory = run.paths.checkpoints
    index = directory / "checkpoint"
    if not index.is_file():
        try:
            started = recorded_start(directory)
        except UserError as error:
            return FAIL, str(error)
        if started is not None:
            return PASS, (f"no checkpoint in {directory}: the next train-project starts FRESH from --source-model "
                          f"{started[0]}, which the stopped run started from ({START_FILE} there)")
        return PASS, f"no checkpoint in {directory}: the next train-project starts FRESH"
    try:
        match = _LATEST.search(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        return FAIL, f"{index}: cannot be read: {error}"
    if not match:
        return FAIL, f"{index}: names no model_checkpoint_path; move {directory} away to start fresh"
    prefix = Path(match.group(1))
    if not prefix.is_absolute():
        prefix = directory / prefix
    shards = list(prefix.parent.glob(prefix.name + ".data-*"))
    if not prefix.with_name(prefix.name + ".index").is_file() or not shards:
        return FAIL, (f"{index}: names {prefix.name}, but its .index or .data files are missing; "
                      f"the next train-project cannot resume: restore them or move {directory} away to start fresh")
    detail = f"the next train-project will RESUME from {prefix}"
    recorded = fine_tuned_network(directory)
    if recorded is not None:
        detail += (f" (the network {recorded['network']} fine-tuned from --source-model {recorded['source']}, "
                   "rebuilt from the checkpoint: --source-model may be left out and the source's files are not "
                   "read; another --source-model is refused)")
    state, problem = read_state_json(directory)
    if problem:
        return WARN, f"{detail}; {problem}"
    if state is None:
        return PASS, detail + f" (no {STATE_FILE} to show its counters)"
    detail += _progress(run, state)
    mismatch = _mismatch(run, state)
    if mismatch:
        return FAIL, (f"{detail}, but the checkpoint was trained for {mismatch}: train-project will refuse "
                      f"to resume; move {directory} away to start fresh")
    if state.get("checkpoint") not in (None, prefix.name):
        return WARN, (f"{detail}; {STATE_FILE} describes {state['checkpoint']}, not the latest checkpoint "
                      f"{prefix.name} (a run stopped between the two writes): its counters may be behind")
    return PASS, detail


def _epochs(epoch_count) -> str:
    if epoch_count == FIT:
        return (f'epoch_count "{FIT}": train-project plans the epochs from its --time-limit, which it then needs '
                "(again at each resume)")
    return f"{epoch_count} epoch(s)"


def _progress(run: Run, state: dict) -> str:
    epochs = run.config.epoch_count if run.config is not None else state.get("epoch_count")
    fit = epochs == FIT
    if fit:
        epochs = state.get("epoch_count")  # the plan of the run that wrote the checkpoint
    records = state.get("train_records") if isinstance(state.get("train_records"), int) else None
    described = describe_resume_point(state, records, epochs if isinstance(epochs, int) else None)
    text = f": {described}" if described else ""
    done = resume_point(state, records).get("used_epoch")
    if isinstance(done, int) and isinstance(epochs, int) and done >= epochs:
        text += (f"; all {epochs} epoch(s) are trained, so it only exports the final model again "
                 + (f"(set epoch_count to a number above {epochs} to train on)" if fit else
                    "(raise epoch_count to train on)"))
    return text


def _mismatch(run: Run, state: dict) -> str | None:
    """What the checkpoint was trained for that the project no longer is."""
    found = []
    config = run.config
    if config is not None:
        if "model" in state and state["model"] != config.model:
            found.append(f"model {state['model']} (project.json: {config.model})")
        saved = (state.get("image_height"), state.get("image_width"))
        if None not in saved and saved != (config.image_height, config.image_width):
            found.append(f"input {saved[0]}x{saved[1]} (project.json: {config.image_height}x{config.image_width})")
        blocks = state.get("trainable_blocks")  # absent before the key existed: null
        if blocks != config.trainable_blocks:
            found.append(f"trainable_blocks {'null' if blocks is None else blocks} (project.json: "
                         f"{'null' if config.trainable_blocks is None else config.trainable_blocks})")
    if run.tags is not None and "tags_hash" in state and state["tags_hash"] != tags_hash(run.tags):
        found.append("a different tags.txt")
    return ", ".join(found) or None


def check_lock(run: Run):
    """train-project's lock file, judged as the next train-project would judge it."""
    lock = run.paths.lock
    owner = read_owner(lock)
    if owner is None:
        return PASS, "no training run holds the project lock"
    if not owner:
        return WARN, f"{lock} exists with unreadable content: a train-project may be starting or was killed"
    who = f"pid {owner.get('pid')} on host {owner.get('hostname')}"
    if owner_is_stale(lock, owner):
        return PASS, f"{lock} was left by {who}, which is no longer running; the next train-project takes it over"
    return WARN, (f"{lock}: held by {who}: a train-project may be running on this project "
                  "(if none is, delete the file)")


def check_duplicates(run: Run):
    """Identical (and with --check-duplicates near-identical) images on both sides of the split."""
    config = run.need("config")
    connection = run.need("connection")
    if not run.eligible:
        raise _Skip("no eligible posts")
    if config.validation_fraction <= 0:
        return PASS, "validation_fraction is 0: no validation split for duplicates to leak into"
    parameters = (*config.image_extensions, config.minimum_tag_count)
    sql = records.eligible_query(config.image_extensions)
    if not run.check_duplicates:
        # Only the rows sharing a file, found by SQLite: the split of a million posts costs seconds in Python.
        shared = (f"(md5, file_ext) IN (SELECT md5, file_ext FROM posts WHERE "
                  f"{records.eligible_where(config.image_extensions)} GROUP BY md5, file_ext HAVING COUNT(*) > 1)")
        sql = records.eligible_query(config.image_extensions, also=shared)
        parameters = parameters * 2
    rows = connection.execute(sql, parameters).fetchall()
    split_keys = records.split_keys(connection, config.database_path)
    side = {row_id: in_validation(split_keys.get(row_id, row_id), config.validation_fraction, config.seed)
            for row_id, *_ in rows}
    validation_total = sum(side.values()) if run.check_duplicates else None
    images = config.require_database().parent / records.IMAGES_DIR
    content = {row_id: (md5, ext) for row_id, md5, ext, _ in rows}  # rows naming one file are identical
    near: set = set()
    hashed = run.check_duplicates and duplicates.pillow_available()
    if not run.check_duplicates:
        note = ("; only rows naming the same file were compared: --check-duplicates reads every image "
                "for identical files and near-identical pictures")
    else:
        note = "" if hashed else "; Pillow is not installed, so near-identical images were not looked for"
        digests, hashes, unread = {}, {}, 0
        for row_id, md5, ext, _ in rows:
            path = records.image_path(images, md5, ext)
            try:
                digests[row_id] = duplicates.file_md5(path)
                if hashed:
                    hashes[row_id] = duplicates.dhash(path)
            except (OSError, ValueError, SyntaxError):  # what Pillow raises for a broken image
                unread += 1
        content.update(digests)
        near = duplicates.near_pairs(hashes, run.max_distance)
        if unread:
            note += f"; {unread:,} image(s) could not be read (see the images check)"
    report = duplicates.crossing(duplicates.identical_pairs(content), near, side.__getitem__, hashed)
    what = f"identical or near-identical (dHash within {run.max_distance} bits)" if report.hashed else "identical"
    of_total = "" if validation_total is None else f" of {validation_total:,}"
    if not report.pairs:
        checked = "" if validation_total is None else f" ({validation_total:,} validation posts)"
        return PASS, f"no {what} images on both sides of the split{checked}{note}"
    return WARN, (f"{report.pairs:,} pair(s) of {what} images cross the split ({report.identical:,} identical, "
                  f"{report.near:,} near-identical): {report.validation_images:,}{of_total} "
                  "validation posts have a copy in training, so validation figures are optimistic; a new dataset "
                  "can keep them on one side (--group-duplicates, docs/datasets.md)" + note)


PROJECT_CHECKS = (
    ("config", check_config),
    ("tags", check_tags),
    ("model", check_model),
    ("database", check_database),
    ("eligible", check_eligible),
    ("md5", check_md5),
    ("shards", check_shards),
    ("images", check_images),
    ("labels", check_labels),
    ("duplicates", check_duplicates),
    ("split", check_split),
    ("checkpoint", check_checkpoint),
    ("lock", check_lock),
)

CONFIG_CHECKS = (("config", check_config),)
PATH_CHECKS = (("tags", check_tags), ("paths", check_paths))
