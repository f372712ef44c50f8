"""ema_decay: an exponential moving average of the weights, kept in the checkpoint beside them.

After every step (in the compiled step, cross-replica): average = decay * average + (1 - decay) * weight,
for every float weight of the model, batch-norm statistics included (as timm's ModelEmaV2 does), so
the averaged model is self-consistent. The average starts as a copy of the weights the run starts from.

Validation and exports see the average through `swapped()`, which exchanges the two sets of values
and exchanges them back afterwards: assignments only, so training continues on bit-identical weights.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

CHECKPOINT_KEY = "ema"


class WeightAverage:
    """Create inside the strategy scope (the averages mirror the weights); checkpoint `.state`."""

    def __init__(self, model, decay: float):
        self.decay = float(decay)
        self.weights = [w for w in model.weights if "float" in str(w.dtype)]
        self.averages = [tf.Variable(w.value, trainable=False, name="average") for w in self.weights]
        # Only the averages: the weights are already saved under the model's key.
        self.state = tf.Module(name=CHECKPOINT_KEY)
        self.state.averages = self.averages
        self._depth = 0  # swapped() may nest (an export that validates): only the outermost exchanges

    def update(self) -> None:
        """Call in cross-replica context after the optimizer step."""
        decay = tf.constant(self.decay, tf.float32)
        for weight, average in zip(self.weights, self.averages):
            average.assign(decay * average + (1.0 - decay) * weight.value)

    def reset(self) -> None:
        """Start the average at the current weights (a checkpoint written without ema_decay)."""
        for weight, average in zip(self.weights, self.averages):
            average.assign(weight.value)

    def _exchange(self) -> None:
        for weight, average in zip(self.weights, self.averages):
            kept = tf.identity(weight.value)
            weight.assign(average)
            average.assign(kept)

    @contextlib.contextmanager
    def swapped(self):
        if self._depth == 0:
            self._exchange()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._exchange()


def checkpoint_has_average(checkpoint_path: str) -> bool:
    return any(name.startswith(CHECKPOINT_KEY + "/") for name, _ in tf.train.list_variables(checkpoint_path))
