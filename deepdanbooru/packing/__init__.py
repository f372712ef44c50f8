"""deepdanbooru pack: the pictures fitted to the training box once, in shards training reads (TensorFlow)."""
