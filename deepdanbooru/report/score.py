"""Scoring the validation split once: the trainer's figures (scoring.scorer) and the page's pictures.

The records, preprocessing, loss and metrics are those of training's validation and of
`evaluate-project --metrics`, so the page's figures for the best export are the ones its best.json holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import DatasetError, ModelError, file_field
from deepdanbooru.report.collect import PageCollector
from deepdanbooru.report.progress import Bar


@dataclass
class Scored:
    metrics: object  # scoring.metrics.ValidationMetrics
    pictures: PageCollector
    skipped: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def load_checked(config, model_file: Path, tags, tags_path: Path, allow_gpu=False):
    """The model, refused with one line when its outputs do not match tags.txt or its input is unusable."""
    from deepdanbooru.inference.predict import check_output_width, configure_devices, model_input_size
    from deepdanbooru.models.files import load_model_file

    configure_devices(allow_gpu)
    model = load_model_file(model_file)
    check_output_width(model, model_file, tags, tags_path)
    model_input_size(model, model_file, config)
    return model


def score_split(config, model, model_file: Path, tags, records, categories: dict, *, batch_size=32, stream=None,
                echo_err=print) -> Scored:
    from deepdanbooru.inference.predict import model_input_size
    from deepdanbooru.models.losses import project_loss
    from deepdanbooru.pipeline.gaps import PositionGaps
    from deepdanbooru.pipeline.packed import scoring_input
    from deepdanbooru.scoring.metrics import ValidationMetrics
    from deepdanbooru.scoring.scorer import BatchScorer

    height, width = model_input_size(model, model_file, config)
    scoring = scoring_input(config.project_dir, config, records, tags, height=height, width=width,
                            batch_size=batch_size)
    if scoring.notice:
        echo_err(scoring.notice)
    paths, dataset = scoring.paths, scoring.dataset
    scorer = BatchScorer(model, project_loss(config, "none"), height, width)
    metrics = ValidationMetrics(scorer.n_tags, threshold=config.validation_threshold, categories=categories)
    pictures = PageCollector(scorer.n_tags)
    gaps = PositionGaps()
    bar = Bar("Scoring the validation split", len(paths), stream)
    done = 0
    try:
        for batch in dataset:
            labels = batch["label"].numpy()
            positions = batch["position"].numpy()
            scores, loss_sum = scorer(batch["image"], labels)
            metrics.update(scores, labels, loss_sum)
            pictures.update(scores, labels, positions)
            gaps.observe(positions)
            done = int(positions[-1]) + 1
            bar.update(done)
    except ValueError as error:
        raise ModelError(file_field(model_file, None, f"unusable scores: {error}")) from None
    finally:
        seconds = bar.close()
    scored = Scored(metrics, pictures, seconds=seconds)
    for index in gaps.missing(range(len(paths))).tolist():
        reason = scoring.diagnose(paths[index], config.max_image_pixels)
        scored.skipped.append((paths[index], reason))
        echo_err(f"skipped {paths[index]}: {reason}")
    if metrics.samples == 0:
        raise DatasetError(f"none of the {len(paths)} validation images could be read; see the reasons above")
    return scored
