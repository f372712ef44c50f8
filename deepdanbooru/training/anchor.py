"""What holds a fine-tune near its source while it trains, step by step (the start: training.wise.StartWeights).

weight_decay_toward "start": the optimizer's decoupled weight decay pulls each weight the run trains toward
the value it started from, w <- w - rate * weight_decay * (w - start), instead of toward zero (L2-SP, Li et
al. 2018). The head's kernel columns of the tags the source does not know still decay toward zero; biases,
normalization parameters and the other weights weight_decay skips are still not decayed.

known_head_rate f: the head's kernel columns and bias entries of the tags the source knows move f times as
far each step as the optimizer moves them (their learning rate and their decay times f); the rest of the
network, and a new tag's column, learn at the full rate.

Both read the tags the source knows, kept in the checkpoint (a resumed run does not read the source again),
and the start, which the checkpoint keeps as well; so a resumed run steps exactly as an unbroken one.
"""

from __future__ import annotations

from deepdanbooru.models.head import has_bias, head_layer
from deepdanbooru.training.start import known_tags_state

CHECKPOINT_KEY = "source_anchor"
TOWARD_START = "start"


class SourceAnchor:
    """Create inside the strategy scope after the model, the optimizer and the start, before the checkpoint is
    restored; it sets the optimizer's hooks (compat.FusedUpdate) once, before the first step."""

    def __init__(self, model, optimizer, start, known, toward_start: bool, head_rate: float | None):
        """`optimizer`: the inner one (whose state is checkpointed); `known`: tags.txt positions of the tags the
        source knows (a fresh run's; a resume's come from its checkpoint)."""
        self.known, self.state = known_tags_state(model, known, CHECKPOINT_KEY)
        head = head_layer(model)
        if toward_start:
            optimizer.set_decay_targets([(weight, self._target(weight, begun, head))
                                         for weight, begun in zip(start.weights, start.starts) if weight.trainable])
        if head_rate is not None and head_rate != 1.0:
            rate = float(head_rate)

            def factor():
                return 1.0 + (rate - 1.0) * self.known.value()

            rows = [head.kernel, head.bias] if has_bias(head) else [head.kernel]
            optimizer.set_row_factors([(weight, factor) for weight in rows])

    def _target(self, weight, begun, head):
        if weight is head.kernel:  # its last axis is the tags': a new tag's column decays toward zero
            return lambda: begun.value() * self.known.value()
        return begun.value
