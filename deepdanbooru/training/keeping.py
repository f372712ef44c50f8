"""What a fine-tune keeps of its source: the copy of the weights the run starts from, which wise_ft mixes with
(training.wise), and source_distillation's teacher run on that copy (training.distill)."""

from __future__ import annotations

from deepdanbooru.training.distill import Distillation
from deepdanbooru.training.start import shared_tags
from deepdanbooru.training.wise import StartWeights, check_resumable


def start_weights(plan, model, partial, latest, recorded, echo) -> tuple[StartWeights | None, Distillation | None]:
    """(start, teacher) for a run whose project.json asks for either and that has a source, else (None, None)
    with a notice where the keys ask for a source the run lacks."""
    config = plan.config
    if not config.wise_ft and not config.source_distillation:
        return None, None
    if plan.source_model is None and recorded is None:
        if config.wise_ft:
            echo(f"notice: wise_ft in {config.config_path} mixes with a --source-model's weights; this run "
                 "starts from no source, so its exports hold the trained weights")
        if config.source_distillation:
            echo(f"notice: source_distillation in {config.config_path} learns from a --source-model's "
                 "scores; this run starts from no source, so it learns from the labels alone")
        return None, None
    check_resumable(latest, config)
    start = StartWeights(model, config.wise_ft or (), partial.frozen if partial else ())
    distill = Distillation(model, config.source_distillation, shared_tags(plan), start) \
        if config.source_distillation else None
    return start, distill
