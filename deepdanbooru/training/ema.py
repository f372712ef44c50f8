"""ema_decay: an exponential moving average of the weights, kept in the checkpoint beside them.

After every step (in the compiled step, cross-replica): average = d * average + (1 - d) * weight,
for every float weight of the model, batch-norm statistics included (as timm's ModelEmaV2 does), so
the averaged model is self-consistent. The average starts as a copy of the weights the run starts from.

d warms up: d = min(ema_decay, (1 + n) / (10 + n)) with n the steps trained before this one
(used_minibatch), the rule of TensorFlow's ExponentialMovingAverage with num_updates and of timm's
ModelEmaV3. Without it, at ema_decay 0.999 the average after 1,000 steps is still 37% the initial
weights, and so are the early validations and the best model. n is the step counter the checkpoint
restores, so a resumed run averages exactly as one that never stopped.

Validation and exports see the average through `swapped()`, which exchanges the two sets of values
and exchanges them back afterwards: assignments only, so training continues on bit-identical weights.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

CHECKPOINT_KEY = "ema"


class WeightAverage:
    """Create inside the strategy scope (the averages mirror the weights); checkpoint `.state`."""

    def __init__(self, model, decay: float, frozen=()):
        """`frozen`: layers whose weights never change in this run (trainable_blocks): their average would be
        themselves, so they are left out, and the step does not average them."""
        self.decay = float(decay)
        still = {id(weight) for layer in frozen for weight in layer.weights}
        self.weights = [w for w in model.weights if "float" in str(w.dtype) and id(w) not in still]
        self.averages = [tf.Variable(w.value, trainable=False, name="average") for w in self.weights]
        # Only the averages: the weights are already saved under the model's key.
        self.state = tf.Module(name=CHECKPOINT_KEY)
        self.state.averages = self.averages
        self._depth = 0  # swapped() may nest (an export that validates): only the outermost exchanges

    def decay_at(self, steps_before):
        """The decay of the update after `steps_before` steps (a tensor or a number)."""
        n = tf.cast(steps_before, tf.float32)
        return tf.minimum(tf.constant(self.decay, tf.float32), (1.0 + n) / (10.0 + n))

    def update(self, steps_before) -> None:
        """Call in cross-replica context after the optimizer step; `steps_before`: used_minibatch before it."""
        decay = self.decay_at(steps_before)
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
