"""tf.function with XLA (`jit_compile`) where the function compiles, and one notice where it does not.

A function compiled with jit_compile=True is compiled whole before its first
execution, so a function XLA cannot compile (an op without an XLA kernel, or
without a deterministic one while op determinism is on) fails at its first
call having changed nothing. `XlaFunction` then says why in one line and runs
the same function as a plain graph from then on.
"""

from __future__ import annotations

import re

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
