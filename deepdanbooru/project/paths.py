"""Where a project keeps its state: one place, so every room agrees.

Exports are named `model-<name>...` after the network that trained: project.json's `model` for a run from
the model table (DeepDanbooru's names), the network's own name for a run from --source-model (an imported
WD ViT trains as vit_base_patch16_448 whatever `model` says; a source Keras named itself, such as
functional_1, keeps `model`). The run records the name it exports under in
its checkpoints and checkpoints/state.json (`exports`), and keeps it when resumed; a checkpoint written
before the record existed keeps `model`, the name its exports already have. Tools that read a project
(evaluate, export-bundle, grad-cam, conv2tflite, preflight) take the name from state.json (`export_name`).
"""

from __future__ import annotations

import re
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

    def export_name(self, model: str) -> str:
        """The name the project's exports carry (see the module's docstring): state.json's record; without one,
        `model` (project.json's) when a file of that name is here or no other name is; else the one other name
        the exports here carry (a fine-tune whose checkpoints were deleted)."""
        from deepdanbooru.runstate.state import read_state_json

        state, _ = read_state_json(self.checkpoints)
        recorded = state.get("exports") if state else None
        if isinstance(recorded, str) and recorded and recorded == safe_export_name(recorded):
            return recorded
        names = {path.name[len("model-"):].split(".", 1)[0] for path in self.root.glob("model-*.*")
                 if path.suffix in (".keras", ".h5")}
        others = names - {model}
        return others.pop() if model not in names and len(others) == 1 else model

    @staticmethod
    def float32_copy(export: Path) -> Path:
        """model-x.e3.keras -> model-x.e3.float32.keras"""
        return export.with_name(export.stem + ".float32.keras")


# The names Keras gives a model nobody named (tf.keras 2 and Keras 3): they say nothing of what trained.
_UNNAMED = re.compile(r"^(?:functional|model|sequential)(?:_\d+)?$")


def safe_export_name(network: str) -> str:
    """`network` (a Keras model's name) as a file-name part: letters, digits, _ and - only (no dots, which
    separate the name from .e3, .best, ...); "" when nothing is left or Keras named it (functional_1, model)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", network).strip("_")
    return "" if _UNNAMED.match(name) else name
