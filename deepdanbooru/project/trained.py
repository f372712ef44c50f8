"""What a project has trained with its tags.txt, and keeping a tags.txt that is replaced (standard library).

A checkpoint records a hash of tags.txt (train-project refuses to resume
after it changed) and an exported model has one output per tags.txt line, in
that order: replacing the file leaves both without the vocabulary they were
trained on. make-tags asks before it does that, and keeps the old file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.fileio import write_bytes_atomic

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
    has_checkpoint = (directory / "checkpoint").is_file() or any(directory.glob("ckpt-*.index"))
    exports = tuple(sorted([*paths.root.glob("model-*.keras"), *paths.root.glob("model-*.h5")]))
    return TrainedWithTags(directory if has_checkpoint else None, exports)


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
