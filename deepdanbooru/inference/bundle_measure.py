"""The bundle's thresholds and metrics, measured on pictures fed as the tagger tools feed them.

Each record's picture is prepared as kohya's tagger prepares it (toolfeed:
alpha on white, white square, area resize to the bundle's input size, BGR
0-255) and run through the bundle's own graph (the function converted to
model.onnx, whose agreement with it export-bundle checks). The figures cover
the rows that carry a project tag, in bundle order; each category's published
figures (the P=R thresholds among them) come from its rows. The loss is not
measured: the bundle's rows are not the model's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deepdanbooru.errors import DatasetError
from deepdanbooru.project import categories as cat


@dataclass
class BundleMeasurement:
    result: dict
    skipped: list = field(default_factory=list)  # (path, reason)


def label_matrix(tag_strings, tags, sources) -> np.ndarray:
    """float32 [records, len(sources)]: 1 where the record carries the tag of that row's source."""
    column = {tags[source]: position for position, source in enumerate(sources)}
    labels = np.zeros((len(tag_strings), len(sources)), np.float32)
    for row, text in enumerate(tag_strings):
        for tag in text.split():
            if tag in column:
                labels[row, column[tag]] = 1.0
    return labels


def measure_as_tools(function, records, tags, plan, size, batch_size, config, echo) -> BundleMeasurement:
    from deepdanbooru.inference.toolfeed import tool_batches
    from deepdanbooru.scoring.metrics import ValidationMetrics

    measured = plan.measured
    rank = {position: index for index, position in enumerate(measured)}
    categories = {cat.LABELS[number]: [rank[position] for position in plan.positions(number) if position in rank]
                  for number in (cat.GENERAL, cat.CHARACTER)}
    metrics = ValidationMetrics(len(measured), threshold=config.validation_threshold,
                                categories={name: indices for name, indices in categories.items() if indices})
    labels = label_matrix(records.tag_strings, tags, [plan.rows[position].source for position in measured])
    paths = records.paths()
    summary = BundleMeasurement({})
    for indices, images, skipped in tool_batches(paths, size, batch_size, config.max_image_pixels):
        for index, reason in skipped:
            summary.skipped.append((paths[index], reason))
            echo(f"skipped {paths[index]}: {reason}")
        if indices:
            scores = np.asarray(function(images), dtype=np.float32)[:, measured]
            metrics.update(scores, labels[indices])
    if metrics.samples == 0:
        raise DatasetError(f"none of the {len(paths)} pictures could be read; see the reasons above")
    summary.result = metrics.result()
    return summary
