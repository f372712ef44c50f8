"""Batched prediction through the shared inference preprocessing."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from deepdanbooru.errors import ModelError, file_field


def configure_devices(allow_gpu: bool) -> list[str]:
    """Hide GPUs unless allowed, as DeepDanbooru did: tagging a few images does
    not pay for GPU start-up, and a GPU busy training stays untouched.

    Must run before TensorFlow places any op; later it cannot take effect.
    Returns the visible devices ("CPU:0", ...) for --verbose.
    """
    import tensorflow as tf

    if not allow_gpu:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:
            if tf.config.get_visible_devices("GPU"):
                warnings.warn("TensorFlow was already initialised with a GPU visible; it stays in use")
    from deepdanbooru.tfruntime import tune_graph_optimizer

    tune_graph_optimizer()
    return [f"{device.device_type}:{device.name.rsplit(':', 1)[-1]}" for device in tf.config.get_visible_devices()]


def model_input_size(model, model_path, config=None) -> tuple[int, int]:
    """(height, width) from the model's input shape; the project's only when the model leaves it open."""
    shape = tuple(model.input_shape)
    if len(shape) != 4 or shape[-1] != 3:
        raise ModelError(file_field(model_path, "input", f"expected (batch, height, width, 3) images, got {shape}"))
    height, width = shape[1], shape[2]
    if height is None or width is None:
        if config is None:
            raise ModelError(file_field(model_path, "input", "has no fixed size; use --project-path to give one"))
        return config.image_height, config.image_width
    return int(height), int(width)


def check_output_width(model, model_path, tags, tags_path) -> None:
    width = model.output_shape[-1]
    if len(model.output_shape) != 2 or width != len(tags):
        raise ModelError(file_field(model_path, "output",
                                    f"has shape {tuple(model.output_shape)}, but {tags_path} lists {len(tags)} tags"))


class Tagger:
    """A loaded model plus what its inputs must look like."""

    def __init__(self, model, tags, model_path: Path, config=None, max_image_pixels=None, compile_model=True,
                 fill=None):
        import tensorflow as tf

        from deepdanbooru.pipeline import Fill

        self.model = model
        self.tags = list(tags)
        self.model_path = Path(model_path)
        self.height, self.width = model_input_size(model, model_path, config)
        self.max_image_pixels = max_image_pixels
        self.fill = fill or Fill()
        if compile_model:
            # One traced graph for every batch size: the last, partial batch must not retrace.
            signature = [tf.TensorSpec((None, self.height, self.width, 3), tf.float32)]
            self._call = tf.function(lambda images: model(images, training=False), input_signature=signature,
                                     reduce_retracing=True, autograph=False)
        else:
            self._call = lambda images: model(images, training=False)

    def scores(self, images) -> np.ndarray:
        return np.asarray(self._call(images), dtype=np.float32)

    def batches(self, paths, batch_size: int, on_skip: Callable[[int, str], None]):
        """(indices into paths, preprocessed images) batch by batch, in order (prepared_batches)."""
        return prepared_batches(paths, height=self.height, width=self.width, batch_size=batch_size,
                                max_image_pixels=self.max_image_pixels, fill=self.fill, on_skip=on_skip)

    def predict(self, paths, batch_size: int, on_skip: Callable[[int, str], None]) -> Iterator[tuple[int, np.ndarray]]:
        """(index into paths, scores) for every readable image, in order; on_skip(index, reason) for the rest."""
        for positions, images in self.batches(paths, batch_size, on_skip):
            scores = self.scores(images)
            for position, row in zip(positions, scores):
                yield int(position), row

    def images(self, paths, on_skip: Callable[[int, str], None]) -> Iterator[tuple[int, np.ndarray]]:
        """(index into paths, float32 [height, width, 3] image) one by one, for per-image tools."""
        for positions, images in self.batches(paths, 1, on_skip):
            yield int(positions[0]), images[0].numpy()


def prepared_batches(paths, *, height: int, width: int, batch_size: int, max_image_pixels: int, fill,
                     on_skip: Callable[[int, str], None]):
    """(indices into paths, float32 images [b, height, width, 3] in [0, 1]) batch by batch, in order.

    The pictures as evaluate gives them to the model: the pipeline's inference preprocessing (decode,
    fit, centre, `fill`, / 255), the one of validation and training without augmentation. The
    pipeline drops unreadable images; positions are ascending, so each gap is reported through
    on_skip(index, reason) as soon as the next image past it arrives (and the tail gaps at the end).
    """
    from deepdanbooru.pipeline import diagnose, inference_dataset
    from deepdanbooru.pipeline.gaps import PositionGaps

    dataset = inference_dataset([str(path) for path in paths], height=height, width=width, batch_size=batch_size,
                                max_image_pixels=max_image_pixels, fill=fill)
    gaps, checked = PositionGaps(), 0

    def skip_gaps(stop):
        nonlocal checked
        for index in gaps.missing(np.arange(checked, stop)).tolist():
            on_skip(index, diagnose(paths[index], max_image_pixels))
        checked = max(checked, stop)

    for batch in dataset:
        positions = batch["position"].numpy()
        gaps.observe(positions)
        skip_gaps(int(positions[-1]) + 1)
        yield positions, batch["image"]
    skip_gaps(len(paths))


def load_tagger(files, tags, compile_model=True, alpha=None, padding=None) -> Tagger:
    """alpha ("white" or "drop") and padding ("border" or "white"): pipeline.fill; None: the project's key
    (DeepDanbooru's without a project)."""
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.pipeline import Fill

    model = load_model_file(files.model)
    check_output_width(model, files.model, tags, files.tags)
    fill = Fill.from_config(files.config, alpha, padding)
    return Tagger(model, tags, files.model, files.config, files.max_image_pixels, compile_model, fill)
