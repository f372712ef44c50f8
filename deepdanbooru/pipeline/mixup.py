"""Mixup (Zhang et al. 2018) inside each training batch, seeded per record like the warp."""

from __future__ import annotations

import tensorflow as tf

from deepdanbooru.pipeline.transform import record_key

# Another stream than the warp's (transform.EXTRA_STREAM), so turning mixup on changes no warp.
MIXUP_STREAM = 0x2545F4914F6CDD1D


def mixup_weight(hashed_seed, position, alpha: float):
    """One record's weight ~ Beta(alpha, alpha): a pure function of (seed, random_seed, position)."""
    # Beta from two gammas. float64: with a small alpha both draws can underflow float32 to zero.
    draws = tf.random.stateless_gamma([2], seed=record_key(hashed_seed, position, MIXUP_STREAM), alpha=alpha,
                                      dtype=tf.float64)
    total = draws[0] + draws[1]
    return tf.cast(tf.where(total > 0.0, draws[0] / total, 0.5), tf.float32)


def mix_batch(images, labels, weights):
    """Record i becomes w_i * itself + (1 - w_i) * record b-1-i of the batch, images and labels alike.

    Pairing by reversal needs no more random numbers and keeps every record in
    the batch; a lone record (odd batch middle, batch of one) stays as it is.
    """
    image_weights = weights[:, None, None, None]
    label_weights = weights[:, None]
    partners_images = tf.reverse(images, axis=[0])
    partners_labels = tf.reverse(labels, axis=[0])
    return (partners_images + (images - partners_images) * image_weights,
            partners_labels + (labels - partners_labels) * label_weights)
