"""Provisional: replaced once deepdanbooru.pipeline exists."""
