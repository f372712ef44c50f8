"""Counts and sizes in messages: "1 image", "2 images", "25.3 kB". Standard library only."""


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    return f"{count:,} {singular if count == 1 else plural_form or singular + 's'}"


def size_text(size: float) -> str:
    """A byte count in decimal units, three digits or so: "812 B", "25.3 kB", "1.2 MB", "3.4 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} B"
