"""The compiled train step and the in-graph sums it keeps (StepSums).

Written against the tf.distribute API so a strategy other than the default
runs it unchanged: per-replica work in `strategy.run`, the loss averaged over
the real global batch (partial batches included), values reduced across
replicas before they are added to the sums. Nothing here reads a tensor back to
the host; the loop does that only when it prints or checkpoints.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from deepdanbooru.compiling import XlaFunction
from deepdanbooru.models.losses import as_loss
from deepdanbooru.training.strategy import sum_across_replicas, take_over_gradient_reduction

THRESHOLD = 0.5  # the console's precision / recall / F1 are at this score

_SUM = tf.distribute.ReduceOp.SUM


def _counter(name, dtype=tf.float64, initial=0):
    return tf.Variable(initial, dtype=dtype, trainable=False, name=name)


class StepSums:
    """In-graph sums the step keeps: those since the last console line, plus two the loop reads less often.

    float64: counts of true positives over a window of 10,000 tags x 3,200
    samples pass float32's exact-integer range (2**24).
    """

    WINDOW = ("loss_sum", "samples", "true_positives", "false_positives", "false_negatives")

    def __init__(self):
        for name in self.WINDOW:
            setattr(self, name, _counter(name))
        self.total_samples = _counter("total_samples")  # since the run started; gives used_sample
        self.step = _counter("step", tf.int64)  # = used_minibatch after the step
        self.first_bad_step = _counter("first_bad_step", tf.int64, -1)

    def read_window(self) -> dict[str, float]:
        values = {name: float(getattr(self, name).numpy()) for name in self.WINDOW}
        for name in self.WINDOW:
            getattr(self, name).assign(0.0)
        return values

    def first_bad(self) -> int | None:
        step = int(self.first_bad_step.numpy())
        return step if step >= 0 else None


def threshold_counts(scores, labels):
    """(true positives, false positives, false negatives) at THRESHOLD over a batch, as float64 scalars."""
    predicted = tf.cast(scores >= THRESHOLD, tf.float64)
    truth = tf.cast(labels, tf.float64)
    return (
        tf.reduce_sum(predicted * truth),
        tf.reduce_sum(predicted * (1.0 - truth)),
        tf.reduce_sum((1.0 - predicted) * truth),
    )


class TrainStep:
    """`TrainStep(...)(distributed_batch)` runs one optimisation step on every replica."""

    def __init__(self, strategy, model, optimizer, loss, loss_scaled: bool, count_metrics: bool = True, ema=None,
                 jit_compile: bool = False, echo=print, distill=None):
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss_scaled = loss_scaled
        # False only to measure what the counts cost (bench/metrics_overhead.py): precision etc. then read 0.
        self.count_metrics = count_metrics
        # `loss`: a name, or a Loss made with reduction "none": per-example values, so the average can be
        # taken over the real (maybe partial) global batch.
        self.loss = as_loss(loss, "none")
        self.ema = ema  # training.ema.WeightAverage or None
        self.distill = distill  # training.distill.Distillation or None
        take_over_gradient_reduction(optimizer, strategy)
        with strategy.scope():
            self.sums = StepSums()
        # Under XLA where it compiles (compiling.XlaFunction); MaxPooling2D layers must then compute as
        # strided maxima (models.pooling) for op determinism to allow it.
        copies = strategy.num_replicas_in_sync
        if jit_compile and copies > 1:
            echo(f"jit_compile: the training step runs without XLA, which cannot compile it: its variables have "
                 f"{copies} copies on {copies} devices (replicated training), and one XLA program runs on one device")
            jit_compile = False
        self._function = XlaFunction(self._step, None, jit_compile, "the training step", echo)
        self._bound = False

    @property
    def jit_compile(self) -> bool:
        """Whether the step runs under XLA (False after a fallback)."""
        return self._function.jit_compile

    def bind(self, element_spec) -> None:
        """Compile for batches of this spec (batch dimension None): one trace serves full and partial batches."""
        if not self._bound:
            # Converting the step's source with autograph cost ~0.8 s of the first step (py-spy,
            # docs/performance.md); its branches are on Python values, so it is traced without.
            self._function.retrace([element_spec])
            self._bound = True

    def retrace(self) -> None:
        """Compile again at the next bind: the model's trainable variables changed."""
        self._bound = False

    def __call__(self, batch) -> None:
        self._function(batch)

    def _replica_step(self, images, labels):
        variables = self.model.trainable_variables
        # The pipeline's multi-hot op loses the static rank; Keras losses need it.
        labels = tf.ensure_shape(labels, [None, self.model.output_shape[-1]])
        local = tf.shape(labels)[0]
        global_batch = tf.distribute.get_replica_context().all_reduce(_SUM, local)
        targets = self.distill.targets(images) if self.distill is not None else None
        with tf.GradientTape() as tape:
            scores = self.model(images, training=True)
            per_example = self.loss(labels, scores)
            # source_distillation adds to what trains, not to the loss the console prints (the labels' alone).
            trained = per_example if self.distill is None else per_example + self.distill.per_example(targets, scores)
            loss = tf.nn.compute_average_loss(trained, global_batch_size=global_batch)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            scaled = self.optimizer.scale_loss(loss) if self.loss_scaled else loss
        # Summed here, not inside the optimizer, so clipping and the overflow check see the global gradient.
        gradients = sum_across_replicas(tape.gradient(scaled, variables))
        # The loss-scale optimizer unscales and skips steps whose gradients overflowed.
        self.optimizer.apply_gradients(zip(gradients, variables))

        loss_sum = tf.reduce_sum(tf.cast(per_example, tf.float64))
        if not self.count_metrics:
            zero = tf.constant(0.0, tf.float64)
            return loss_sum, tf.cast(local, tf.float64), zero, zero, zero
        return (loss_sum, tf.cast(local, tf.float64), *threshold_counts(scores, labels))

    def _step(self, batch):
        per_replica = self.strategy.run(self._replica_step, args=(batch["image"], batch["label"]))
        loss_sum, samples, tp, fp, fn = (self.strategy.reduce(_SUM, value, axis=None) for value in per_replica)
        c = self.sums
        if self.ema is not None:
            self.ema.update(c.step)
        c.step.assign_add(1)
        # Recorded, not raised: raising would need a host sync every step.
        bad = tf.logical_and(tf.logical_not(tf.math.is_finite(loss_sum)), c.first_bad_step < 0)
        c.first_bad_step.assign(tf.where(bad, c.step, c.first_bad_step))
        c.loss_sum.assign_add(loss_sum)
        c.samples.assign_add(samples)
        c.total_samples.assign_add(samples)
        c.true_positives.assign_add(tp)
        c.false_positives.assign_add(fp)
        c.false_negatives.assign_add(fn)


def build_optimizer(make, policy_is_mixed: bool) -> tuple[keras.optimizers.Optimizer, keras.optimizers.Optimizer]:
    """(optimizer to step with, inner optimizer whose state is checkpointed)."""
    inner = make()
    if policy_is_mixed:
        return keras.optimizers.LossScaleOptimizer(inner), inner
    return inner, inner
