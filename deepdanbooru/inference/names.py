"""File names made from tag and image names: safe on every common file system, and unique."""

from __future__ import annotations

import re

# Path separators, characters Windows forbids, control characters, and the bytes of a name that is not UTF-8
# (Python holds them as lone surrogates, which no file system outside Linux takes).
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\<>:"|?*\ud800-\udfff]')
_WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}
# Leaves room for a suffix like ".gradcam.png" within the usual 255-byte limit.
_MAX_BYTES = 200


def safe_file_name(name: str) -> str:
    """`name` with unsafe characters replaced by '_', no leading dots (hidden, or '..'), never empty."""
    name = _UNSAFE.sub("_", name)
    # Windows drops trailing dots and spaces, which would make two names collide there.
    name = name.strip(" ").rstrip(".")
    if name.startswith("."):
        name = "_" + name.lstrip(".")
    if name.split(".")[0].upper() in _WINDOWS_DEVICES:
        name = "_" + name
    encoded = name.encode("utf-8")[:_MAX_BYTES]
    name = encoded.decode("utf-8", errors="ignore")
    return name or "_"


class UniqueNames:
    """Hands out safe names, adding '-2', '-3'... when two inputs map to the same one
    (e.g. tags 'a/b' and 'a_b'), compared case-insensitively for case-insensitive file systems."""

    def __init__(self):
        self._used: set[str] = set()

    def __call__(self, name: str) -> str:
        base = safe_file_name(name)
        candidate, number = base, 1
        while candidate.casefold() in self._used:
            number += 1
            candidate = f"{base}-{number}"
        self._used.add(candidate.casefold())
        return candidate
