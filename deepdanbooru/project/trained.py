"""What a project has trained with its tags.txt, and keeping a tags.txt that is replaced (standard library).

A checkpoint records a hash of tags.txt (train-project refuses to resume
after it changed) and an exported model has one output per tags.txt line, in
that order: replacing the file leaves both without the vocabulary they were
trained on. make-tags and download-tags ask before they do that, and keep the old file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import TagsError, file_field
from deepdanbooru.fileio import write_bytes_atomic, write_text_atomic
from deepdanbooru.project.resume import has_checkpoint

SHOWN_EXPORTS = 3  # exports named one by one before the rest are counted


@dataclass(frozen=True)
class TrainedWithTags:
    checkpoints: Path | None  # the checkpoint folder, when it holds a checkpoint
    exports: tuple[Path, ...]  # model-*.keras and model-*.h5 in the project folder

    def __bool__(self) -> bool:
        return self.checkpoints is not None or bool(self.exports)

    def describe(self) -> str:
        """'the checkpoints in X and the exported models (model-a.keras, model-a.e1.keras)'."""
        parts = []
        if self.checkpoints is not None:
            parts.append(f"the checkpoints in {self.checkpoints}")
        if self.exports:
            names = ", ".join(path.name for path in self.exports[:SHOWN_EXPORTS])
            more = len(self.exports) - SHOWN_EXPORTS
            parts.append(f"the exported models ({names}{f' and {more} more' if more > 0 else ''})")
        return " and ".join(parts)

    def consequences(self) -> str:
        """What stops working once tags.txt holds other tags."""
        parts = []
        if self.checkpoints is not None:
            parts.append("train-project refuses to resume from the checkpoints")
        if self.exports:
            parts.append("the exported models' outputs no longer match the lines of tags.txt that evaluate and "
                         "evaluate-project read with them")
        return " and ".join(parts)


def trained_with_tags(paths) -> TrainedWithTags:
    """The project's checkpoints and exported models (paths: project.paths.ProjectPaths)."""
    directory = paths.checkpoints
    # A checkpoint's files without the index naming it (a run killed while saving its first) count too.
    saved = has_checkpoint(directory) or any(directory.glob("ckpt-*.index"))
    exports = tuple(sorted([*paths.root.glob("model-*.keras"), *paths.root.glob("model-*.h5")]))
    return TrainedWithTags(directory if saved else None, exports)


def keep_copy(path: Path) -> Path:
    """Copy `path` beside itself as NAME.replaced-<UTC time>.SUFFIX (never over another file); the copy's path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    copy = path.with_name(f"{path.stem}.replaced-{stamp}{path.suffix}")
    number = 1
    while copy.exists():
        number += 1
        copy = path.with_name(f"{path.stem}.replaced-{stamp}-{number}{path.suffix}")
    write_bytes_atomic(copy, path.read_bytes())
    return copy


def check_tags_replaceable(target: Path, paths, allow_trained: bool) -> TrainedWithTags | None:
    """What was trained with the project's tags.txt (`target`), or None; refused (TagsError) while a run holds the
    project, and without allow_trained when its checkpoints or exported models were trained with it."""
    from deepdanbooru.runstate.lock import describe_owner, owner_is_stale, read_owner

    owner = read_owner(paths.lock)
    if owner is not None and not owner_is_stale(paths.lock, owner):
        # The run reads tags.txt at its start and checks it at every resume: it would stop at the next one.
        raise TagsError(file_field(target, None, (
            f"not replaced: a train-project holds this project ({describe_owner(owner)}, {paths.lock}); "
            "replace it once that run has stopped")))
    trained = trained_with_tags(paths)
    if trained and not allow_trained:
        raise TagsError(file_field(target, None, (
            f"not replaced: {trained.describe()} were trained with it, and with other tags "
            f"{trained.consequences()}; for other tags start a new project (create-project, then make-tags "
            "there), or add --allow-trained to replace it anyway (the current file is kept beside it)")))
    return trained or None


def write_tags_file(target: Path, content: str, paths, allow_trained: bool):
    """Write `content` to `target`; (what was trained with the old file, the copy kept of it), both None when
    the project's own tags.txt did not change or nothing was trained with it (check_tags_replaceable)."""
    if not (target.exists() and target.resolve() == paths.tags.resolve() and target.read_bytes() != content.encode()):
        write_text_atomic(target, content)
        return None, None
    trained = check_tags_replaceable(target, paths, allow_trained)
    kept = keep_copy(target) if trained else None
    write_text_atomic(target, content)
    return trained, kept
