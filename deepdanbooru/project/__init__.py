"""Project directory: configuration, tags and paths. Standard library only."""
