"""Tag strings -> multi-hot float32 vectors in tags.txt order, in-graph and per batch."""

from __future__ import annotations

import tensorflow as tf


def tag_table(tags) -> tf.lookup.StaticHashTable:
    """tag -> output index; unknown tags look up as -1."""
    keys = tf.constant(list(tags), tf.string)
    values = tf.range(len(tags), dtype=tf.int64)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=-1)


def multi_hot(tag_strings, table, tag_count: int):
    """[b] space-separated tag strings -> float32 [b, tag_count].

    Any whitespace run separates tags (repeated spaces are harmless), unknown
    tags are ignored and a tag repeated in one string still counts once.
    """
    tokens = tf.strings.split(tag_strings)
    indices = table.lookup(tokens)
    indices = tf.ragged.boolean_mask(indices, indices >= 0)
    return tf.math.bincount(indices, minlength=tag_count, maxlength=tag_count, axis=-1,
                            binary_output=True, dtype=tf.float32)
