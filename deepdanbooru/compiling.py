"""tf.function with XLA (`jit_compile`) where the function compiles, and one notice where it does not.

A function compiled with jit_compile=True is compiled whole before its first
execution, so a function XLA cannot compile (an op without an XLA kernel, or
without a deterministic one while op determinism is on) fails at its first
call having changed nothing. `XlaFunction` then says why in one line and runs
the same function as a plain graph from then on.
"""

from __future__ import annotations

import re

import keras
import tensorflow as tf

# What TensorFlow raises when a jit_compile function does not compile.
_COMPILE_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, tf.errors.InternalError)
_XLA_WORDS = re.compile(r"XLA|tf2xla|jit_compile|compil", re.IGNORECASE)


def compile_failure_reason(error: Exception) -> str | None:
    """The one line that says why XLA refused, or None when `error` is not a compile failure."""
    message = str(getattr(error, "message", error))
    if not _XLA_WORDS.search(message):
        return None
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # TensorFlow puts the op's own complaint first and the function's name in a later "tf2xla conversion" line.
    for line in lines:
        if "tf2xla conversion failed" not in line and not line.startswith(("Stack trace", "[[", "{{")):
            return " ".join(re.sub(r"\{\{[^}]*\}\}|\[\[[^\]]*\]\]", "", line).split())[:240]
    return lines[0][:240] if lines else type(error).__name__


class XlaFunction:
    """`XlaFunction(fn, signature, jit_compile, what, echo)(*args)`: fn traced once per `retrace()`."""

    def __init__(self, function, input_signature, jit_compile: bool, what: str, echo=print):
        self.python_function = function
        self.input_signature = input_signature
        self.jit_compile = bool(jit_compile)
        self.what = what
        self.echo = echo
        self.fallback_reason: str | None = None
        self._function = None
        self._ran = False

    def retrace(self, input_signature=None) -> None:
        """Trace (and compile) again at the next call, e.g. after the trainable variables changed."""
        if input_signature is not None:
            self.input_signature = input_signature
        self._function = None
        self._ran = False

    def _build(self):
        # No autograph (as Keras's own steps): the branches are on Python values.
        return tf.function(self.python_function, input_signature=self.input_signature, autograph=False,
                           jit_compile=self.jit_compile)

    def __call__(self, *args):
        if self._function is None:
            self._function = self._build()
        if self._ran or not self.jit_compile:
            return self._function(*args)
        try:
            result = self._function(*args)
        except _COMPILE_ERRORS as error:
            reason = compile_failure_reason(error)
            if reason is None:
                raise
            self.fallback_reason = reason
            self.echo(f"jit_compile: {self.what} runs without XLA, which cannot compile it: {reason}")
            self.jit_compile = False
            self._function = self._build()
            result = self._function(*args)
        self._ran = True
        return result


def _layers(model):
    """Every layer of `model`, nested models' layers included."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def _is_patch_embedding(layer) -> bool:
    """A convolution that cuts its input into non-overlapping patches (kernel equal to strides): a matmul."""
    return (tuple(layer.kernel_size) == tuple(layer.strides) and getattr(layer, "groups", 1) == 1
            and not isinstance(layer, (keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D)))


def xla_pays(model) -> bool:
    """Whether XLA measured faster for a network like `model`: one whose every convolution is a patch embedding.

    On this project's CPU (docs/performance.md, bench/xla.py) XLA ran the ViTs' training step 1.16x faster,
    the convolutional networks' 0.28x-0.61x as fast (its CPU convolutions, depthwise ones most of all, are
    slower than oneDNN's) and resnet_small's 1.05x (within noise).
    """
    convolutions = [layer for layer in _layers(model)
                    if isinstance(layer, (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                                          keras.layers.DepthwiseConv2D, keras.layers.SeparableConv2D,
                                          keras.layers.Conv2DTranspose))]
    return all(_is_patch_embedding(layer) for layer in convolutions)


def choose_jit_compile(setting, model, replicas: int = 1, echo=print) -> bool:
    """project.json's jit_compile (True, False or "auto") for this model; "auto" says what it chose when it compiles.

    "auto" leaves replicated training (`replicas` > 1) uncompiled without a word: one XLA program runs on one
    device, so the step could not compile there (an explicit true gets the step's notice saying so).
    """
    if not isinstance(setting, str):
        return bool(setting)
    chosen = replicas == 1 and xla_pays(model)
    if chosen:
        echo('jit_compile "auto": the training step and validation compile with XLA (every convolution of this '
             'network is a patch embedding; "jit_compile": false turns it off)')
    return chosen


def prepare_for_xla(setting, model, replicas: int = 1, echo=print) -> bool:
    """choose_jit_compile, once the model is built ("auto" looks at its layers, so a resumed run decides as the run
    it resumes did); where it compiles, the model's MaxPooling2D layers then compute as strided maxima
    (XLA has no deterministic MaxPool gradient, and training keeps op determinism on; same values)."""
    from deepdanbooru.models.pooling import use_strided_max_pooling

    chosen = choose_jit_compile(setting, model, replicas, echo)
    if chosen:
        use_strided_max_pooling(model)
    return chosen
