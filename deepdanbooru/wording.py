"""Counts in messages: "1 image", "2 images". Standard library only."""


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    return f"{count:,} {singular if count == 1 else plural_form or singular + 's'}"
