"""wise_ft: a fine-tune's last export mixes the weights it trained with those it started from (WiSE-FT).

For each mixing weight a of the project's `wise_ft` list, every float weight the run trains (batch-norm
statistics too) is set to (1 - a) * start + a * trained, where start is what the run started from (the
--source-model with its head mapped onto tags.txt, a new tag's row at its prior) and trained what
validation would measure (the moving average under ema_decay); the mix scoring the best validation mAP
is what the final export (and a --time-limit stop's) holds. mAP, not best_model_metric: the mix moves
how sure the model is (its scores shrink toward the start's), which the thresholds written beside the
export follow, so a ranking figure chooses it. Layers that never train (trainable_blocks) are the
same in both and left alone.

The start is kept beside the weights in every checkpoint, so a resumed run mixes with the same one. The
run's weights are mixed only while the export is written and validated: training continues from the
trained weights, bit for bit. Without a --source-model the start is a random initialisation, nothing
worth mixing with: the run says so and exports the trained weights.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from deepdanbooru.errors import TrainingError, file_field

CHECKPOINT_KEY = "start_weights"  # wise_ft's and source_distillation's
CHOICE_METRIC = "map"
TRIGGER = "wise_ft"
# The exports that hold the mix: the run's last weights (the end, or a --time-limit stop).
MIXED_EXPORTS = ("final", "time limit")


class StartWeights:
    """The weights a run starts from; create inside the strategy scope right after the model is made, before
    the checkpoint is restored (a resumed run's start comes from its checkpoint)."""

    def __init__(self, model, alphas, frozen=()):
        self.alphas = tuple(float(a) for a in alphas)
        still = {id(weight) for layer in frozen for weight in layer.weights}
        self.weights = [w for w in model.weights if "float" in str(w.dtype) and id(w) not in still]
        self.starts = [tf.Variable(w.value, trainable=False, name="start") for w in self.weights]
        self.state = tf.Module(name=CHECKPOINT_KEY)
        self.state.starts = self.starts

    @contextlib.contextmanager
    def mixed(self, alpha: float):
        """The model's weights are (1 - alpha) * start + alpha * current while inside, exactly as before after."""
        if alpha == 1.0:
            yield
            return
        kept = [tf.identity(w.value) for w in self.weights]
        for weight, start, value in zip(self.weights, self.starts, kept):
            mix = (1.0 - alpha) * tf.cast(start, tf.float32) + alpha * tf.cast(value, tf.float32)
            weight.assign(tf.cast(mix, weight.dtype))
        try:
            yield
        finally:
            for weight, value in zip(self.weights, kept):
                weight.assign(value)

    def choose(self, validate) -> tuple[float, object, dict[float, float]]:
        """(alpha, its validation report, {alpha: validation mAP}) over the list; `validate()` measures the
        model as it is. A tie goes to the larger alpha (the more trained)."""
        tried, best = {}, None
        for alpha in sorted(self.alphas, reverse=True):
            with self.mixed(alpha):
                report = validate()
            value = float(report.result[CHOICE_METRIC])
            tried[alpha] = value
            if best is None or value > best[1]:
                best = (alpha, value, report)
        return best[0], best[2], dict(sorted(tried.items()))


def checkpoint_holds(checkpoint_path: str, key: str) -> bool:
    return any(name.startswith(key + "/") for name, _ in tf.train.list_variables(checkpoint_path))


def check_resumable(latest: str | None, config) -> None:
    """A run resumed with wise_ft, source_distillation, weight_decay_toward "start" or known_head_rate needs what
    its checkpoint records of the start: one written without the key has none."""
    from deepdanbooru.training.anchor import CHECKPOINT_KEY as ANCHORED
    from deepdanbooru.training.distill import CHECKPOINT_KEY as DISTILLED

    if not latest:
        return
    anchored = (CHECKPOINT_KEY, ANCHORED)
    for key, needs in (("wise_ft", (CHECKPOINT_KEY,)), ("source_distillation", (CHECKPOINT_KEY, DISTILLED)),
                       ("weight_decay_toward", anchored), ("known_head_rate", anchored)):
        if getattr(config, key) not in (None, "zero") and not all(checkpoint_holds(latest, name) for name in needs):
            raise TrainingError(file_field(config.config_path, key, (
                f"{latest} was written without {key}, so it does not hold what the run started from; set {key} "
                "back to null to resume it, or start the run again (delete the checkpoints folder) to use it")))
