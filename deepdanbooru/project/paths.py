"""Where a project keeps its state: one place, so every room agrees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.project.config import PROJECT_FILE
from deepdanbooru.project.tags import TAGS_FILE


@dataclass(frozen=True)
class ProjectPaths:
    root: Path

    def __init__(self, root):
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / PROJECT_FILE

    @property
    def tags(self) -> Path:
        return self.root / TAGS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def bad_images(self) -> Path:
        return self.logs / "bad_images.txt"

    @property
    def history(self) -> Path:
        return self.logs / "history.jsonl"

    @property
    def lock(self) -> Path:
        return self.root / ".train.lock"

    def epoch_export(self, model: str, epoch: int) -> Path:
        return self.root / f"model-{model}.e{epoch}.keras"

    def final_export(self, model: str) -> Path:
        return self.root / f"model-{model}.keras"

    def stopped_export(self, model: str) -> Path:
        """What a --time-limit stop exports: never the final export's name before the run completes."""
        return self.root / f"model-{model}.stopped.keras"

    def best_export(self, model: str) -> Path:
        return self.root / f"model-{model}.best.keras"

    def legacy_export(self, model: str) -> Path:
        return self.root / f"model-{model}.h5"

    @staticmethod
    def float32_copy(export: Path) -> Path:
        """model-x.e3.keras -> model-x.e3.float32.keras"""
        return export.with_name(export.stem + ".float32.keras")
