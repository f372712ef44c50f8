"""Read-only checks before training. Standard library only."""
