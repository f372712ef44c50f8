"""Optimizer registry: a name from project.json -> a fresh keras optimizer.

Adam and SGD apply their update with TensorFlow's fused per-variable kernels
(ResourceApplyAdam, ResourceApplyKerasMomentum) instead of Keras 3's generic
update_step. The arithmetic is the same (the formulas are written out below);
what changes is the graph: Keras traces about 40 ops per variable (power,
casts, slot arithmetic), 18,700 of the 30,400 ops of resnet_custom_v4's train
step; tracing and the first run of that graph took ~30 s on two cores
(per-step time is about the same either way). Everything else (clipping, loss scaling, the iteration
counter, slot variables and so checkpoints) is Keras's own. Cases the kernels
do not cover (sparse gradients, non-float32 variables, amsgrad) fall back to
Keras's update_step. The hook into Keras's update is private: compat.FusedUpdate, which also
gives every optimizer here per-variable learning rates (layer_decay).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from deepdanbooru import compat
from deepdanbooru.errors import ModelError, file_field
from deepdanbooru.models.head import head_layers
from deepdanbooru.models.table import get_architecture
from deepdanbooru.registry import FAMILIES, PARAMETER_GROUPS


def _fusable(grads_and_vars) -> bool:
    return all(var.dtype == tf.float32 and not isinstance(grad, tf.IndexedSlices) for grad, var in grads_and_vars)


def _update_each(optimizer, distribution, grads_and_vars, slot_lists, learning_rate, apply) -> bool:
    """apply(var, grad, rate, *slots) for every variable, per replica, with that variable's learning rate
    (layer_decay's factor applied) and slot variables."""
    for grad, var in grads_and_vars:
        slots = compat.slot_variables(optimizer, var, slot_lists)
        rate = optimizer.rate_for(var, learning_rate)
        distribution.extended.update(var, apply, args=(grad, rate, *slots), group=False)
    return True


class FusedAdam(compat.FusedUpdate, keras.optimizers.Adam):
    """keras Adam, one ResourceApplyAdam per variable.

    Per variable, with t = iterations + 1: m += (g - m)(1 - beta_1); v += (g^2 - v)(1 - beta_2);
    var -= m * lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(v) + epsilon): Keras's update_step.
    """

    def fused_update(self, distribution, grads_and_vars, learning_rate) -> bool:
        if self.amsgrad or not _fusable(grads_and_vars):
            return False
        f32 = tf.float32
        step = tf.cast(self.iterations + 1, f32)
        beta_1, beta_2 = tf.constant(self.beta_1, f32), tf.constant(self.beta_2, f32)
        shared = (tf.pow(beta_1, step), tf.pow(beta_2, step), beta_1, beta_2, tf.constant(self.epsilon, f32))

        def apply(var, grad, lr, m, v):
            b1_power, b2_power, b1, b2, epsilon = shared
            return tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=m.handle, v=v.handle, beta1_power=b1_power, beta2_power=b2_power, lr=lr,
                beta1=b1, beta2=b2, epsilon=epsilon, grad=tf.cast(grad, f32))

        return _update_each(self, distribution, grads_and_vars, compat.ADAM_SLOTS, tf.cast(learning_rate, f32), apply)


class FusedSGD(compat.FusedUpdate, keras.optimizers.SGD):
    """keras SGD with momentum, one ResourceApplyKerasMomentum per variable.

    Per variable: m = m * momentum - lr * g; then var += m * momentum - lr * g (Nesterov) or var += m.
    """

    def fused_update(self, distribution, grads_and_vars, learning_rate) -> bool:
        if self.momentum == 0 or not _fusable(grads_and_vars):
            return False
        f32 = tf.float32
        momentum = tf.constant(self.momentum, f32)

        def apply(var, grad, lr, m):
            return tf.raw_ops.ResourceApplyKerasMomentum(
                var=var.handle, accum=m.handle, lr=lr, grad=tf.cast(grad, f32), momentum=momentum,
                use_nesterov=self.nesterov)

        return _update_each(self, distribution, grads_and_vars, ("momentums",), tf.cast(learning_rate, f32), apply)


class RMSprop(compat.FusedUpdate, keras.optimizers.RMSprop):
    """keras RMSprop, with per-variable learning rates (no fused kernel)."""


class Lamb(compat.FusedUpdate, keras.optimizers.Lamb):
    """keras Lamb, with per-variable learning rates (no fused kernel)."""


# adamw is Adam with Keras's decoupled decay (var -= var * weight_decay * lr before the Adam step), so it
# keeps the fused kernel. lamb is Keras's Lamb: the same decoupled decay, then the Adam direction scaled
# per variable by ||var|| / ||direction|| (You et al. 2019 fold the decay into that ratio; Keras does not).
OPTIMIZERS = {
    "adam": lambda rate, **options: FusedAdam(learning_rate=rate, **options),
    # DeepDanbooru's "sgd" always meant Nesterov momentum 0.9.
    "sgd": lambda rate, **options: FusedSGD(learning_rate=rate, momentum=0.9, nesterov=True, **options),
    "rmsprop": lambda rate, **options: RMSprop(learning_rate=rate, **options),
    "adamw": lambda rate, **options: FusedAdam(learning_rate=rate, **options),
    "lamb": lambda rate, **options: Lamb(learning_rate=rate, **options),
}

# Layers whose every weight is a normalization parameter (scale, offset; BatchNormalization's moving
# statistics are not trainable and never reach the optimizer).
_NORMALIZATION = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                  keras.layers.GroupNormalization, keras.layers.UnitNormalization)


def _owned_variables(model, head: bool = True):
    """(top-level layer, trainable variable) for every trainable variable, nested sublayers' included; with
    head False, the head's (models.head) left out."""
    skip = set() if head else {id(layer) for layer in head_layers(model)}
    for layer in model.layers:
        if id(layer) not in skip:
            for variable in layer.trainable_weights:
                yield layer, variable


def _placed(groups, layer_name: str) -> bool:
    return groups.is_top(layer_name) or groups.unit_of(layer_name) is not None


def groups_of(model, name: str):
    """The parameter groups that place every trunk layer of `model` (stem, a unit, or top), found from its
    layer names: the family of `name`'s registry row first, then every other family's, import-model's
    included (a --source-model need not be of the row's family: a SwinV2 tagger trained as vit_small_patch16).
    (groups, None) when one places them all; else (groups placing the most, the first layer it cannot place).
    """
    preferred = FAMILIES[get_architecture(name).family].groups
    candidates = [preferred, *(groups for groups in PARAMETER_GROUPS.values() if groups is not preferred)]
    names = list(dict.fromkeys(layer.name for layer, _ in _owned_variables(model, head=False)))
    best, best_unplaced = None, None
    for groups in candidates:
        unplaced = [layer_name for layer_name in names if not _placed(groups, layer_name)]
        if not unplaced:
            return groups, None
        if best is None or len(unplaced) < len(best_unplaced):
            best, best_unplaced = groups, unplaced
    return best, best_unplaced[0]


def decay_exempt(model, name: str) -> list:
    """The trainable variables weight decay must leave alone, as declared, never guessed from shapes.

    Every family: each bias (Keras names every layer's bias, nested ones such as MultiHeadAttention's
    projections' too, "bias") and every weight of a normalization layer. Then the layers the model's family
    (`groups_of`) declares `no_decay` in deepdanbooru.registry's PARAMETER_GROUPS (ConvNeXt's layer scales, the
    ViT's position table and tokens, SwinV2's logit scales and position biases).
    """
    groups, _ = groups_of(model, name)
    return [variable for layer, variable in _owned_variables(model)
            if variable.name == "bias" or isinstance(layer, _NORMALIZATION) or not groups.decays(layer.name)]


def trunk_units(model, name: str, key: str, source=None, network: str | None = None) -> tuple:
    """(groups, ((top-level trunk layer, unit), ...)) for every trunk layer with trainable weights: its unit
    from 0 (`groups_of`: the ViT's blocks, a hierarchical network's stages), -1 for the stem, None for the top
    layers (final norm, top conv). One reading of the model's layer names for layer_decay and
    trainable_blocks. A layer no family places (a model not built by deepdanbooru or import-model, such as a
    DeepDanbooru 1.0 file) is a ModelError naming it, `network` (what the model is, e.g. the --source-model;
    default `name`) and `key`, in `source`'s `key` field when given.
    """
    groups, unplaced = groups_of(model, name)
    if unplaced is not None:
        message = (f"cannot tell which stage or block of {network or name} layer {unplaced!r} belongs to; "
                   f"{key} knows the layers of the models deepdanbooru builds and import-model imports "
                   f"(ViT, EVA02, ConvNeXt, SwinV2)")
        raise ModelError(file_field(source, key, message) if source else f"{key}: {message}")
    layers = dict.fromkeys(layer for layer, _ in _owned_variables(model, head=False))
    return groups, tuple((layer, None if groups.is_top(layer.name) else groups.unit_of(layer.name))
                         for layer in layers)


def unit_count(units) -> int:
    """The number of units (blocks or stages) in `trunk_units`'s placement."""
    return max((unit for _, unit in units if unit is not None), default=-1) + 1


def layer_rate_factors(model, name: str, layer_decay: float | None, source=None, network: str | None = None) -> tuple:
    """((variable, factor), ...) for layer-wise learning-rate decay (BEiT's and timm's fine-tuning rule).

    The stem, units and top come from the model's own layer names (`trunk_units`), so a --source-model of
    any family import-model builds (ViT, EVA02, ConvNeXt, SwinV2) is placed whatever project.json's `model` says.
    With L units (the ViT's blocks, a hierarchical network's stages, counted on the model), unit i (from 0)
    gets layer_decay ** (L - i), the stem (patch and position embeddings, tokens) layer_decay ** (L + 1), the
    top layers and the head 1. None: no factors. A layer no family places is a ModelError (`trunk_units`) in
    `source`'s layer_decay field when given.
    """
    if layer_decay is None:
        return ()
    _, units = trunk_units(model, name, "layer_decay", source, network)
    count = unit_count(units)
    return tuple((variable, layer_decay ** (count - unit)) for layer, unit in units if unit is not None
                 for variable in layer.trainable_weights)


def make_optimizer(name: str, learning_rate: float, clipnorm: float | None = None,
                   global_clipnorm: float | None = None, weight_decay: float | None = None,
                   decay_exempt_variables=(), rate_factors=()) -> keras.optimizers.Optimizer:
    """`clipnorm` clips each variable's gradient on its own; `global_clipnorm` (project key
    gradient_clip_norm) scales all gradients together so their joint norm is at most the value,
    keeping the update's direction. None disables; give at most one. `weight_decay` (adamw, lamb)
    skips `decay_exempt_variables` (see `decay_exempt`). `rate_factors` (see `layer_rate_factors`)
    scale each listed variable's learning rate and decay. Call before the optimizer is built."""
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ModelError(
            f"optimizer: unsupported optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}"
        ) from None
    optimizer = factory(learning_rate, clipnorm=clipnorm, global_clipnorm=global_clipnorm,
                        weight_decay=weight_decay or None)
    if optimizer.weight_decay is not None:
        optimizer.exclude_from_weight_decay(var_list=list(decay_exempt_variables))
    optimizer.set_rate_factors(rate_factors)
    return optimizer
