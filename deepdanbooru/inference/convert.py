"""conv2tflite: convert a Keras tagger to TFLite (or ONNX) and prove the copy answers the same.

A converter can succeed and still produce a model that computes something
else (an unsupported op lowered differently, quantization gone too far), so
every conversion is followed by running both models on the same inputs and
comparing their outputs against a tolerance.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from deepdanbooru import exitcodes
from deepdanbooru.errors import ModelError, UserError, file_field
from deepdanbooru.fileio import write_bytes_atomic
from deepdanbooru.inference.onnx_graph import run_onnx, to_onnx
from deepdanbooru.tfimport import filtered_stderr, quiet_stdout

FORMATS = ("tflite", "onnx")
# Float conversions reorder a few float32 operations: differences of ~1e-6 were measured.
FLOAT_TOLERANCE = 1e-4
# Dynamic-range quantization stores weights in 8 bits; sigmoid outputs moved by
# 0.009 on a trained resnet_small (docs/evaluation.md), so 0.05 leaves room for
# deeper models while still catching a conversion that went wrong.
QUANTIZED_TOLERANCE = 0.05
SAMPLE_COUNT = 8


class ConversionMismatch(UserError):
    """The converted model's outputs differ from Keras' by more than the tolerance."""

    exit_code = exitcodes.FAILED


@dataclass(frozen=True)
class ConversionReport:
    path: Path
    output_format: str
    size_bytes: int
    max_abs_difference: float
    tolerance: float
    samples: int


def choose_format(save_path, output_format=None) -> str:
    """--format, or the one --save-path's extension names; a .tflite or .onnx name of the other format is refused
    (the file would be opened as what it is not)."""
    suffix = Path(save_path).suffix.lower()
    if output_format is not None:
        named = {".tflite": "tflite", ".onnx": "onnx"}.get(suffix, output_format)
        if named != output_format:
            kinds = {"onnx": "an ONNX", "tflite": "a TFLite"}
            raise UserError(f"--save-path {save_path}: names {kinds[named]} file, but --format {output_format} "
                            f"writes {kinds[output_format]} model; name it .{output_format}, or leave --format out")
        return output_format
    return "onnx" if suffix == ".onnx" else "tflite"


def default_tolerance(optimize_default: bool) -> float:
    # Sparsity alone keeps float weights (zeros are only encoded differently), so it is a float conversion.
    return QUANTIZED_TOLERANCE if optimize_default else FLOAT_TOLERANCE


def sample_inputs(height: int, width: int, count: int = SAMPLE_COUNT, seed: int = 0) -> np.ndarray:
    """Inputs in the model's [0, 1] range: flat greys (the extremes), smooth gradients and noise.

    Noise alone keeps every activation near its mean; gradients and flat
    fields push activations to the ends where saturation and rounding differ.
    """
    rng = np.random.default_rng(seed)
    images = np.empty((count, height, width, 3), dtype=np.float32)
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    for index in range(count):
        kind = index % 4
        if kind == 0:
            images[index] = index / max(count - 1, 1)
        elif kind == 1:
            colour = rng.uniform(0, 1, 3).astype(np.float32)
            images[index] = np.clip(ys * colour + xs * (1 - colour), 0, 1)
        elif kind == 2:
            images[index] = rng.uniform(0, 1, (height, width, 3))
        else:
            blocks = rng.uniform(0, 1, (4, 4, 3)).astype(np.float32)
            images[index] = np.kron(blocks, np.ones((-(-height // 4), -(-width // 4), 1)))[:height, :width]
    return images


def load_sample_images(paths, height: int, width: int, max_image_pixels: int, fill) -> np.ndarray:
    """Real images prepared exactly as evaluate gives them to the model (predict.prepared_batches)."""
    from deepdanbooru.inference.predict import prepared_batches

    def refuse(index, reason):
        raise ModelError(file_field(paths[index], None, f"unusable sample image: {reason}"))

    batches = [images.numpy() for _, images in prepared_batches(
        list(paths), height=height, width=width, batch_size=max(len(paths), 1), max_image_pixels=max_image_pixels,
        fill=fill, on_skip=refuse)]
    return np.concatenate(batches).astype(np.float32) if batches else np.zeros((0, height, width, 3), np.float32)


def float32_model(model):
    """A float32 copy of a mixed-precision model: converters and runtimes do float32 best."""
    if all(getattr(layer.dtype_policy, "compute_dtype", "float32") == "float32" for layer in model.layers):
        return model
    from deepdanbooru.models.precision import with_policy

    return with_policy(model, "float32")


def to_tflite(model, optimize_default=False, optimize_sparsity=False) -> bytes:
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    optimizations = []
    if optimize_default:
        optimizations.append(tf.lite.Optimize.DEFAULT)
    if optimize_sparsity:
        optimizations.append(tf.lite.Optimize.EXPERIMENTAL_SPARSITY)
    converter.optimizations = optimizations
    with quiet_stdout():
        return converter.convert()


def run_tflite(content: bytes, images: np.ndarray) -> np.ndarray:
    # The runtime announces its XNNPACK delegate on stderr ("INFO: Created ..."): an INFO line, shown
    # only at TF_CPP_MIN_LOG_LEVEL 0 (--debug).
    with filtered_stderr():
        interpreter = _tflite_interpreter(content)
        source = interpreter.get_input_details()[0]
        target = interpreter.get_output_details()[0]
        interpreter.resize_tensor_input(source["index"], list(images.shape))
        interpreter.allocate_tensors()
        interpreter.set_tensor(source["index"], images.astype(source["dtype"]))
        interpreter.invoke()
        return np.array(interpreter.get_tensor(target["index"]), dtype=np.float32)


def _tflite_interpreter(content: bytes):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        with warnings.catch_warnings():
            # tf.lite.Interpreter warns it is deprecated in favour of ai-edge-litert,
            # which is optional here: it has the same API and gives the same results.
            warnings.simplefilter("ignore")
            return tf.lite.Interpreter(model_content=content)
    return Interpreter(model_content=content)


def convert_model(model, save_path, output_format="tflite", optimize_default=False, optimize_sparsity=False,
                  tolerance=None, images=None) -> ConversionReport:
    """Convert, compare with Keras on `images` (default: sample_inputs), then write `save_path`.

    Nothing is written when the outputs differ by more than `tolerance`: a
    file that looks fine but answers differently is worse than no file.
    """
    save_path = Path(save_path)
    if output_format not in FORMATS:
        raise ModelError(f"--format: must be one of {', '.join(FORMATS)}, got {output_format!r}")
    if output_format == "onnx" and (optimize_default or optimize_sparsity):
        raise ModelError("--optimize-default and --optimize-experimental-sparsity apply to TFLite only")
    if not save_path.parent.is_dir():
        raise ModelError(file_field(save_path, None, "folder does not exist"))
    if save_path.is_dir():
        raise ModelError(file_field(save_path, None, "is a folder; give a file name"))
    if tolerance is None:
        tolerance = default_tolerance(optimize_default)
    shape = model.input_shape
    if len(shape) != 4 or None in shape[1:]:
        raise ModelError(f"the model's input shape {shape} is not (batch, height, width, channels) with a fixed size")
    model = float32_model(model)
    if images is None:
        images = sample_inputs(shape[1], shape[2])
    images = np.asarray(images, dtype=np.float32)
    expected = np.asarray(model(images, training=False), dtype=np.float32)

    if output_format == "tflite":
        content = to_tflite(model, optimize_default, optimize_sparsity)
        actual = run_tflite(content, images)
    else:
        content = to_onnx(model)
        actual = run_onnx(content, images)

    difference = compare_outputs(expected, actual, tolerance, save_path)
    write_bytes_atomic(save_path, content)
    return ConversionReport(save_path, output_format, len(content), difference, tolerance, len(images))


def compare_outputs(expected: np.ndarray, actual: np.ndarray, tolerance: float, save_path) -> float:
    """The largest absolute difference, or ConversionMismatch when shapes differ or it passes `tolerance`."""
    if actual.shape != expected.shape:
        raise ConversionMismatch(f"the converted model answers with shape {actual.shape}, Keras with "
                                 f"{expected.shape}; nothing written to {save_path}")
    difference = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    if not np.isfinite(difference) or difference > tolerance:
        raise ConversionMismatch(
            f"the converted model differs from Keras by up to {difference:.3g} on {len(expected)} sample inputs, "
            f"more than the tolerance {tolerance:g}; nothing written to {save_path} "
            "(raise --tolerance to accept it)")
    return difference


def evaluate_fill(config):
    """What surrounds and lies under a sample picture: as evaluate does by default (the project's padding key,
    border without a project; transparency composited onto white)."""
    from deepdanbooru.inference.evaluate import TaggingOptions
    from deepdanbooru.pipeline import Fill

    return Fill.from_config(config, TaggingOptions.alpha, TaggingOptions.padding)


TFLITE_MAGIC = b"TFL3"  # a FlatBuffer's file identifier, at bytes 4..8 of every .tflite file


def check_save_path(save_path, output_format: str, model_file) -> None:
    """Converting again replaces an earlier conversion; anything else at --save-path (project.json, the model
    being converted, another model) is refused, since the converted bytes would take its place."""
    save_path = Path(save_path)
    if not save_path.is_file():
        return
    if save_path.resolve() == Path(model_file).resolve():
        raise ModelError(file_field(save_path, None, "--save-path is the model being converted; give another file"))
    with open(save_path, "rb") as stream:
        head = stream.read(8)
    earlier = head[4:8] == TFLITE_MAGIC if output_format == "tflite" else save_path.suffix.lower() == ".onnx"
    if not earlier:
        raise ModelError(file_field(save_path, None, (
            f"--save-path already exists and is not a {output_format} model; converting would replace it, so give "
            "another file (or delete this one)")))


def conv2tflite(project_path=None, model_path=None, save_path=None, optimize_default=False,
                optimize_sparsity=False, output_format=None, tolerance=None, sample_images=(),
                echo=print) -> ConversionReport:
    """The conv2tflite command: resolve the model, convert, verify, write, report.

    `sample_images` (files) are compared too, after the generated inputs, prepared as evaluate prepares them.
    """
    from deepdanbooru.inference.model_files import MODEL_KEYS, resolve_model_source
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.project.config import DEFAULT_MAX_IMAGE_PIXELS, load_config

    model_file, kind = resolve_model_source(project_path, model_path)
    output_format = choose_format(save_path, output_format)
    check_save_path(save_path, output_format, model_file)
    model = load_model_file(model_file)
    images = None
    if sample_images:
        shape = model.input_shape
        if len(shape) != 4 or None in shape[1:3]:
            raise ModelError(f"{model_file}: input shape {shape} has no fixed image size")
        config = load_config(project_path, uses=MODEL_KEYS) if project_path else None
        limit = config.max_image_pixels if config else DEFAULT_MAX_IMAGE_PIXELS
        images = np.concatenate([sample_inputs(shape[1], shape[2]),
                                 load_sample_images(sample_images, shape[1], shape[2], limit, evaluate_fill(config))])
    report = convert_model(model, save_path, output_format, optimize_default, optimize_sparsity, tolerance,
                           images)
    echo(f"Converted {model_file} ({kind}) to {report.path} ({report.output_format}, {report.size_bytes:,} bytes)")
    echo(f"Largest absolute difference from Keras on {report.samples} sample inputs: "
         f"{report.max_abs_difference:.3g} (tolerance {report.tolerance:g})")
    return report
