"""A project's final model on its validation split: the scores of all its tags and of a subset alone.

bench/quality.py --held-back FILE calls this after each run: the trainer's validation records the
figures of every tag; this measures the exported model the same way (evaluate-project --metrics'
preprocessing, ValidationMetrics) and averages mAP, macro-F1 at P=R and at per-tag thresholds
over the tags of FILE too (the tags a pretrained model was never taught, for one).
"""

from __future__ import annotations

import warnings
from pathlib import Path

FIGURES = ("map", "pr_f1", "calibrated_macro_f1")


def subset_scores(project: Path, subset: list[str], batch_size: int = 64) -> dict:
    """{"all": {figure: value}, "held_back": {...}, "held_back_tags": n} for the project's final export."""
    import numpy as np

    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.inference.predict import configure_devices, model_input_size
    from deepdanbooru.inference.project_metrics import select_records
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.models.losses import project_loss
    from deepdanbooru.pipeline import Fill, inference_dataset
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.tags import load_tags
    from deepdanbooru.scoring.scorer import BatchScorer, measure

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = load_config(project)
    tags = load_tags(config.project_dir / "tags.txt")
    wanted = set(subset)
    indices = [index for index, tag in enumerate(tags) if tag in wanted]
    records = select_records(config, "validation")
    files = resolve_model_files(project)
    configure_devices(False)
    model = load_model_file(files.model)
    height, width = model_input_size(model, files.model, config)
    dataset = inference_dataset(records.paths(), height=height, width=width, batch_size=batch_size,
                                max_image_pixels=config.max_image_pixels, tag_strings=list(records.tag_strings),
                                tags=tags, fill=Fill.from_config(config))
    metrics = measure(BatchScorer(model, project_loss(config, "none"), height, width), dataset,
                      config.validation_threshold, categories={"held_back": indices})
    result = metrics.result()
    per_tag = result["per_tag"]
    support = per_tag["tp"] + per_tag["fn"]
    chosen = np.zeros(len(tags), dtype=bool)
    chosen[indices] = True
    chosen &= support > 0
    return {
        "model": str(files.model),
        "records": len(records.paths()),
        "all": {name: result[name] for name in FIGURES},
        "held_back": {"map": float(per_tag["ap"][chosen].mean()) if chosen.any() else None,
                      "pr_f1": result["held_back_pr_f1"],
                      "calibrated_macro_f1": float(per_tag["f1"][chosen].mean()) if chosen.any() else None},
        "held_back_tags": int(chosen.sum()),
    }
