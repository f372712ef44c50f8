"""What a fine-tune keeps of its source: the copy of the weights the run starts from, which wise_ft mixes with
(training.wise), source_distillation's teacher run on that copy (training.distill), and the pulls toward it
while training (weight_decay_toward, known_head_rate: training.anchor)."""

from __future__ import annotations

from typing import NamedTuple

from deepdanbooru.training.anchor import TOWARD_START, SourceAnchor
from deepdanbooru.training.distill import Distillation
from deepdanbooru.training.start import shared_tags
from deepdanbooru.training.wise import StartWeights, check_resumable

# The keys that need the start, and what a run without a source does instead.
NO_SOURCE = {
    "wise_ft": "mixes with a --source-model's weights; this run starts from no source, so its exports hold the "
               "trained weights",
    "source_distillation": "learns from a --source-model's scores; this run starts from no source, so it learns "
                           "from the labels alone",
    "weight_decay_toward": "pulls toward a --source-model's weights; this run starts from no source, so weight "
                           "decay pulls toward zero",
    "known_head_rate": "slows the head's rows of the tags a --source-model knows; this run starts from no "
                       "source, so every row learns at the full rate",
}


class Keeping(NamedTuple):
    start: StartWeights | None = None
    distill: Distillation | None = None
    anchor: SourceAnchor | None = None


def asked(config) -> list[str]:
    """The keys of NO_SOURCE that project.json sets to something other than their default."""
    return [key for key in NO_SOURCE if getattr(config, key) not in (None, "zero")]


def start_weights(plan, model, optimizer, partial, latest, recorded, echo) -> Keeping:
    """(start, teacher, anchor) for a run whose project.json asks for any and that has a source, else Nones
    with a notice where the keys ask for a source the run lacks. `optimizer`: the inner one."""
    config = plan.config
    keys = asked(config)
    if not keys:
        return Keeping()
    if plan.source_model is None and recorded is None:
        for key in keys:
            echo(f"notice: {key} in {config.config_path} {NO_SOURCE[key]}")
        return Keeping()
    check_resumable(latest, config)
    start = StartWeights(model, config.wise_ft or (), partial.frozen if partial else ())
    known = shared_tags(plan)
    distill = Distillation(model, config.source_distillation, known, start) if config.source_distillation else None
    anchor = None
    if config.weight_decay_toward == TOWARD_START or config.known_head_rate is not None:
        anchor = SourceAnchor(model, optimizer, start, known, config.weight_decay_toward == TOWARD_START,
                              config.known_head_rate)
    return Keeping(start, distill, anchor)
