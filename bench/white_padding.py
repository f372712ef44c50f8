"""What the tagger tools' white padding costs against our replicated border, on a project's validation split.

    python bench/white_padding.py PROJECT [--model FILE] [--aspects 0.667,1.5]

The tools that load a WD-style bundle (export-bundle) pad a non-square
picture to a square with white before resizing; our inference (and training)
area-resizes keeping the aspect ratio and replicates the border pixels. For
a square picture the two agree. Each validation image is centre-cropped to
every aspect ratio (width / height) in --aspects, then scored both ways by
the same model with the same labels:

- ours: pipeline.preprocess_for_inference with the project's padding and
  alpha keys (what evaluate and validation do; border replication by default);
- tools: white padding to a square, area resize (what the tools feed the bundle:
  inference.toolfeed, flipped back to RGB [0, 1]).

Run it on a model trained with `padding: white` to see what training with the
tools' padding recovers.

Cropping can cut a shape, so compare the two columns of one aspect, not
aspects with each other. Printed: the validation figures of each, the mean
and largest absolute score difference; last line: JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIGURES = ("micro_f1", "macro_f1", "map", "pr_f1", "macro_f1_040")


def crop(image, aspect: float):
    width, height = image.size
    if width / height > aspect:
        new_width = max(1, round(height * aspect))
        left = (width - new_width) // 2
        return image.crop((left, 0, left + new_width, height))
    new_height = max(1, round(width / aspect))
    top = (height - new_height) // 2
    return image.crop((0, top, width, top + new_height))


def white_padded(image, size: int) -> np.ndarray:
    from deepdanbooru.inference.toolfeed import tool_array

    return np.ascontiguousarray(tool_array(image, size)[:, :, ::-1]) / 255.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project")
    parser.add_argument("--model", help="default: the project's final export")
    parser.add_argument("--aspects", default="0.667,1.5", help="width / height ratios to crop to")
    arguments = parser.parse_args()

    import tensorflow as tf
    from PIL import Image

    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.inference.project_metrics import select_records
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.pipeline import Fill, preprocess_for_inference
    from deepdanbooru.project.config import load_config
    from deepdanbooru.project.tags import load_tags
    from deepdanbooru.scoring.metrics import ValidationMetrics

    config = load_config(arguments.project)
    tags = load_tags(config.project_dir / "tags.txt")
    index = {tag: position for position, tag in enumerate(tags)}
    records = select_records(config, "validation")
    files = resolve_model_files(arguments.project, arguments.model)
    model = load_model_file(files.model)
    size = config.image_height
    if config.image_width != size:
        raise SystemExit("the tools feed square images: the project's model must be square")
    labels = np.zeros((len(records), len(tags)), np.float32)
    for row, text in enumerate(records.tag_strings):
        for tag in text.split():
            if tag in index:
                labels[row, index[tag]] = 1.0
    sources = [Image.open(path).convert("RGB") for path in records.paths()]
    summary = {"model": str(files.model), "records": len(records), "padding": config.padding, "aspects": {}}
    fill = Fill.from_config(config)
    print(f"{files.model}: {len(records)} validation images, input {size}x{size}, padding {fill.padding}, "
          f"alpha {fill.alpha}")
    for aspect in [float(value) for value in arguments.aspects.split(",")]:
        ours, tools = [], []
        for image in sources:
            cut = crop(image, aspect)
            encoded = io.BytesIO()
            cut.save(encoded, format="PNG")
            ours.append(preprocess_for_inference(tf.constant(encoded.getvalue()), height=size, width=size,
                                                 max_image_pixels=config.max_image_pixels, fill=fill).numpy())
            tools.append(white_padded(cut, size))
        scores = {}
        results = {}
        for name, images in (("ours", ours), ("tools", tools)):
            scores[name] = np.concatenate([np.asarray(model(np.stack(images[i:i + 64]), training=False))
                                           for i in range(0, len(images), 64)])
            metrics = ValidationMetrics(len(tags), threshold=config.validation_threshold)
            metrics.update(np.clip(scores[name], 0, 1), labels)
            result = metrics.result()
            results[name] = {key: result[key] for key in FIGURES}
        difference = np.abs(scores["tools"] - scores["ours"])
        entry = {**results, "mean_abs_score_difference": float(difference.mean()),
                 "max_abs_score_difference": float(difference.max())}
        summary["aspects"][f"{aspect:g}"] = entry
        print(f"aspect {aspect:g} (width/height):")
        for key in FIGURES:
            a, b = results["ours"][key], results["tools"][key]
            print(f"  {key:<14} ours {a:.4f}  tools {b:.4f}  change {b - a:+.4f}")
        print(f"  scores differ by {entry['mean_abs_score_difference']:.4f} on average, "
              f"{entry['max_abs_score_difference']:.4f} at most")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
