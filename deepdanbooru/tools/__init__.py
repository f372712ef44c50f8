"""Helpers that prepare data for a project; they may use Pillow, never TensorFlow."""
