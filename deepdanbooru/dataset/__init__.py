"""SQLite records and dataset building. Standard library only."""
