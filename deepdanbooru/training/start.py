"""Where a fine-tune starts: --source-model measured on the validation split before the first step.

A fresh run from a source validates the weights it starts with, so its history begins where the
pretrained model stands (an epoch-0, step-0 validation row, trigger "start") and the best model
begins as that start: no later validation replaces it unless it scores strictly better, so the best
export is never worse than the source. The weights measured are the source's, its head mapped onto
tags.txt by name: a tag it shares answers as the source does, a tag it does not know answers with
its prior, (count + 0.5) / (records + 1) of the training records (training.making.grow).

The source's average precision on each tag it shares with the project goes to
logs/source_tag_ap.json, for comparing per tag what the fine-tune made of it. A resumed run does not
measure again: its start is in the files the first run wrote.
"""

from __future__ import annotations

import json
import math

from deepdanbooru.captions import tag_key
from deepdanbooru.fileio import write_text_atomic

START_TRIGGER = "start"
SOURCE_AP_FILE = "source_tag_ap.json"


def known_tags_state(model, known, checkpoint_key: str):
    """(mask, module): a float mask over the model's outputs, 1 at the tags.txt positions in `known` (the tags
    the source knows), and the tf.Module under `checkpoint_key` that carries it in the checkpoint, so a resume
    reads the first run's known tags rather than working them out again."""
    import tensorflow as tf

    values = [0.0] * int(model.output_shape[-1])
    for index in known:
        values[index] = 1.0
    mask = tf.Variable(values, dtype=tf.float32, trainable=False, name="known")
    module = tf.Module(name=checkpoint_key)
    module.known = mask
    return mask, module


def shared_tags(plan) -> list[int]:
    """Positions in tags.txt of the tags the source knows (all of them when its vocabulary is unknown:
    its outputs are then taken to be tags.txt's)."""
    if plan.source_tags is None:
        return list(range(len(plan.tags)))
    known = {tag_key(tag) for tag in plan.source_tags}
    return [index for index, tag in enumerate(plan.tags) if tag_key(tag) in known]


def measure_start(plan, outputs, progress, echo=print):
    """Validate the starting weights of a fresh run from --source-model; returns the report or None
    (no source, no validation records, or not the chief)."""
    if plan.source_model is None or outputs.validator is None:
        return None
    known = shared_tags(plan)
    echo(f"Start: --source-model {plan.source_model.name} as it is, measured on the validation split before the "
         f"first step ({len(known):,} tags it knows, {len(plan.tags) - len(known):,} at their prior)")
    report = outputs.validate(progress, START_TRIGGER)
    path = plan.paths.logs / SOURCE_AP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(source_ap_payload(plan, report, known), indent=2, allow_nan=False) + "\n")
    echo(f"Start: the source's average precision per tag it shares with tags.txt written to {path}")
    return report


def source_ap_payload(plan, report, known) -> dict:
    per_tag = report.result["per_tag"]

    def number(value):
        value = float(value)
        return value if math.isfinite(value) else None  # a tag without positives in the split has no AP

    shared = [plan.tags[index] for index in known]
    aps = [number(per_tag["ap"][index]) for index in known]
    measured = [value for value in aps if value is not None]
    return {
        "source_model": str(plan.source_model),
        "validation_records": report.records,
        "skipped_images": report.skipped,
        "tags": len(shared),
        # Over the shared tags with positives in the split; null when none has.
        "map": sum(measured) / len(measured) if measured else None,
        "ap": {tag: value for tag, value in zip(shared, aps)},
        "support": {tag: int(per_tag["support"][index]) for tag, index in zip(shared, known)},
    }
