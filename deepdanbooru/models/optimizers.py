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
Keras's update_step. The hook into Keras's update is private: compat.FusedUpdate.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from deepdanbooru import compat
from deepdanbooru.errors import ModelError


def _fusable(grads_and_vars) -> bool:
    return all(var.dtype == tf.float32 and not isinstance(grad, tf.IndexedSlices) for grad, var in grads_and_vars)


def _update_each(optimizer, distribution, grads_and_vars, slot_lists, apply) -> bool:
    """apply(var, grad, *slots) for every variable, per replica, with that variable's slot variables."""
    for grad, var in grads_and_vars:
        slots = compat.slot_variables(optimizer, var, slot_lists)
        distribution.extended.update(var, apply, args=(grad, *slots), group=False)
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
        shared = (tf.pow(beta_1, step), tf.pow(beta_2, step), tf.cast(learning_rate, f32), beta_1, beta_2,
                  tf.constant(self.epsilon, f32))

        def apply(var, grad, m, v):
            b1_power, b2_power, lr, b1, b2, epsilon = shared
            return tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=m.handle, v=v.handle, beta1_power=b1_power, beta2_power=b2_power, lr=lr,
                beta1=b1, beta2=b2, epsilon=epsilon, grad=tf.cast(grad, f32))

        return _update_each(self, distribution, grads_and_vars, compat.ADAM_SLOTS, apply)


class FusedSGD(compat.FusedUpdate, keras.optimizers.SGD):
    """keras SGD with momentum, one ResourceApplyKerasMomentum per variable.

    Per variable: m = m * momentum - lr * g; then var += m * momentum - lr * g (Nesterov) or var += m.
    """

    def fused_update(self, distribution, grads_and_vars, learning_rate) -> bool:
        if self.momentum == 0 or not _fusable(grads_and_vars):
            return False
        f32 = tf.float32
        lr, momentum = tf.cast(learning_rate, f32), tf.constant(self.momentum, f32)

        def apply(var, grad, m):
            return tf.raw_ops.ResourceApplyKerasMomentum(
                var=var.handle, accum=m.handle, lr=lr, grad=tf.cast(grad, f32), momentum=momentum,
                use_nesterov=self.nesterov)

        return _update_each(self, distribution, grads_and_vars, ("momentums",), apply)


OPTIMIZERS = {
    "adam": lambda rate, **clip: FusedAdam(learning_rate=rate, **clip),
    # DeepDanbooru's "sgd" always meant Nesterov momentum 0.9.
    "sgd": lambda rate, **clip: FusedSGD(learning_rate=rate, momentum=0.9, nesterov=True, **clip),
    "rmsprop": lambda rate, **clip: keras.optimizers.RMSprop(learning_rate=rate, **clip),
}


def make_optimizer(name: str, learning_rate: float, clipnorm: float | None = None,
                   global_clipnorm: float | None = None) -> keras.optimizers.Optimizer:
    """`clipnorm` clips each variable's gradient on its own; `global_clipnorm` (project key
    gradient_clip_norm) scales all gradients together so their joint norm is at most the value,
    keeping the update's direction. None disables; give at most one."""
    try:
        factory = OPTIMIZERS[name]
    except KeyError:
        raise ModelError(
            f"optimizer: unsupported optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}"
        ) from None
    return factory(learning_rate, clipnorm=clipnorm, global_clipnorm=global_clipnorm)
