"""grad-cam: why the model predicted a tag, as pictures.

Two maps per predicted tag, both at the model's input size (the image as the
model saw it, after the inference preprocessing):

- Grad-CAM (Selvaraju et al.): the activations of the last convolutional
  stage, each channel weighted by the spatial mean of the tag score's
  gradient with respect to it, summed, passed through relu, upsampled and
  overlaid on the image as a heat map.
- The input-gradient saliency map that DeepDanbooru called "grad-cam": the
  largest absolute gradient of the score over the three colour channels of
  each pixel, plus the image masked by it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from PIL import Image

from deepdanbooru.errors import ModelError
from deepdanbooru.fileio import write_bytes_atomic
from deepdanbooru.inference.model_files import resolve_model_files
from deepdanbooru.inference.names import UniqueNames
from deepdanbooru.inference.output import print_err
from deepdanbooru.inference.predict import configure_devices, load_tagger
from deepdanbooru.inference.targets import collect_targets
from deepdanbooru.project.tags import load_tags
from deepdanbooru.wording import plural

_POOLING = (
    keras.layers.AveragePooling2D, keras.layers.MaxPooling2D,
    keras.layers.GlobalAveragePooling2D, keras.layers.GlobalMaxPooling2D,
)
# Share of the heat map in the Grad-CAM overlay: enough to read, the image stays visible.
OVERLAY_ALPHA = 0.45


def feature_tensor(model: keras.Model):
    """The last 4-D activation of the trunk, before the head.

    Walking back from the output, pooling and flatten layers belong to the
    head. In a conv head (1x1 conv to n_tags, global pool) the first 4-D map
    met is the class-activation map itself; Grad-CAM takes what that conv
    reads, the last stage's output, which also works for DeepDanbooru's
    models whatever their layer names.
    """
    n_tags = model.output_shape[-1]
    for layer in reversed(model.layers):
        if isinstance(layer, _POOLING) or isinstance(layer, keras.layers.InputLayer):
            continue
        output = layer.output
        if len(output.shape) != 4:
            continue
        if isinstance(layer, keras.layers.Conv2D) and layer.filters == n_tags and tuple(layer.kernel_size) == (1, 1):
            return layer.input
        if output.shape[-1] != n_tags:
            return output
    raise ModelError(f"model {model.name!r} has no 4-D convolutional activation for Grad-CAM")


def logit_tensor(model: keras.Model):
    """The pre-sigmoid score when the model ends in a sigmoid activation, else the output.

    A confident prediction saturates the sigmoid, whose gradient then
    vanishes (~1e-9 at a score of 0.999999) and leaves blank maps; the
    logit's gradient carries the same evidence without that decay.
    """
    last = model.layers[-1]
    if isinstance(last, keras.layers.Activation) and getattr(last.activation, "__name__", "") == "sigmoid":
        return last.input
    return model.output


@dataclass
class TagMaps:
    tag_index: int
    score: float
    gradcam: np.ndarray  # (height, width) in [0, 1]
    saliency: np.ndarray  # (height, width) in [0, 1]


class Explainer:
    """Computes both maps for several tags of one image in a single forward and backward pass."""

    def __init__(self, model: keras.Model):
        self.model = model
        self.height, self.width = model.input_shape[1:3]
        self._probe = keras.Model(model.input, [feature_tensor(model), logit_tensor(model), model.output])

    def scores(self, image: np.ndarray) -> np.ndarray:
        return np.asarray(self.model(image[None], training=False), dtype=np.float32)[0]

    def explain(self, image: np.ndarray, tag_indices) -> list[TagMaps]:
        tag_indices = [int(i) for i in tag_indices]
        if not tag_indices:
            return []
        # One copy of the image per tag: row k's gradient is that of tag k's score
        # alone, since inference-mode batch norm keeps the rows independent.
        batch = tf.constant(np.repeat(image[None].astype(np.float32), len(tag_indices), axis=0))
        picks = tf.constant(np.stack([np.arange(len(tag_indices)), tag_indices], axis=1))
        with tf.GradientTape() as tape:
            tape.watch(batch)
            features, logits, scores = self._probe(batch, training=False)
            total = tf.reduce_sum(tf.gather_nd(tf.cast(logits, tf.float32), picks))
        feature_gradients, input_gradients = tape.gradient(total, [features, batch])
        features = tf.cast(features, tf.float32)
        feature_gradients = tf.cast(feature_gradients, tf.float32)

        weights = tf.reduce_mean(feature_gradients, axis=(1, 2), keepdims=True)
        cams = tf.nn.relu(tf.reduce_sum(weights * features, axis=-1, keepdims=True))
        cams = tf.image.resize(cams, (self.height, self.width), method="bilinear")[..., 0].numpy()
        saliency = tf.reduce_max(tf.abs(input_gradients), axis=-1).numpy()
        chosen = tf.gather_nd(tf.cast(scores, tf.float32), picks).numpy()
        return [
            TagMaps(index, float(chosen[k]), _normalise(cams[k]), _normalise(saliency[k]))
            for k, index in enumerate(tag_indices)
        ]


def _normalise(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] by the maximum; an all-zero map (no evidence) stays zero."""
    values = np.maximum(np.nan_to_num(values.astype(np.float32)), 0.0)
    peak = float(values.max()) if values.size else 0.0
    return values / peak if peak > 0 else np.zeros_like(values)


def heat_colours(values: np.ndarray) -> np.ndarray:
    """Map [0, 1] to RGB in [0, 1] through blue, cyan, yellow, red (a jet-like scale)."""
    stops = np.array([0.0, 0.35, 0.65, 1.0])
    colours = np.array([[0.0, 0.0, 0.5], [0.0, 0.8, 1.0], [1.0, 0.9, 0.0], [0.8, 0.0, 0.0]])
    flat = np.clip(values, 0.0, 1.0).ravel()
    rgb = np.stack([np.interp(flat, stops, colours[:, c]) for c in range(3)], axis=-1)
    return rgb.reshape(values.shape + (3,))


def gradcam_overlay(image: np.ndarray, cam: np.ndarray) -> np.ndarray:
    return (1.0 - OVERLAY_ALPHA) * image + OVERLAY_ALPHA * heat_colours(cam)


def masked_image(image: np.ndarray, saliency: np.ndarray) -> np.ndarray:
    return image * saliency[..., None]


def to_png(pixels: np.ndarray, path: Path) -> None:
    array = np.clip(np.rint(np.asarray(pixels) * 255.0), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    write_bytes_atomic(path, buffer.getvalue())


# Suffix -> picture made from (image, maps). Names say which method made the file.
PICTURES = {
    "gradcam": lambda image, maps: gradcam_overlay(image, maps.gradcam),
    "saliency": lambda image, maps: maps.saliency,
    "masked": lambda image, maps: masked_image(image, maps.saliency),
}


@dataclass
class GradCamSummary:
    written: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def write_explanations(explainer: Explainer, image: np.ndarray, tags, threshold: float, folder: Path) -> list[Path]:
    """PNGs for every tag scoring at least `threshold`: <tag>.<picture>.png under `folder`."""
    scores = explainer.scores(image)
    chosen = np.flatnonzero(scores >= threshold)
    if chosen.size == 0:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    names = UniqueNames()
    written = []
    for maps in explainer.explain(image, chosen):
        stem = names(tags[maps.tag_index])
        for suffix, picture in PICTURES.items():
            path = folder / f"{stem}.{suffix}.png"
            to_png(picture(image, maps), path)
            written.append(path)
    return written


def grad_cam_command(project_path, target, output=".", threshold=0.5, allow_gpu=False, echo=print,
                     echo_err=print_err) -> GradCamSummary:
    """The grad-cam command: TARGET is an image or a folder (searched recursively)."""
    paths = collect_targets([target], allow_folder=True)
    files = resolve_model_files(project_path)
    tags = load_tags(files.tags)
    configure_devices(allow_gpu)
    tagger = load_tagger(files, tags)
    echo_err(f"Model: {files.model} ({files.kind})")  # once it loaded: a bad model gets its one error line alone
    explainer = Explainer(tagger.model)
    output = Path(output)
    folders = UniqueNames()
    summary = GradCamSummary()

    def skip(index, reason):
        summary.skipped.append((paths[index], reason))
        echo_err(f"skipped {paths[index]}: {reason}")

    for index, image in tagger.images(paths, skip):
        folder = output / folders(paths[index].stem)
        written = write_explanations(explainer, image, tags, threshold, folder)
        summary.written.extend(written)
        count = len(written) // len(PICTURES)
        echo(f"{paths[index]}: {plural(count, 'tag')} -> {folder}" if count else
             f"{paths[index]}: no tag scored {threshold} or more; nothing written")
    return summary
