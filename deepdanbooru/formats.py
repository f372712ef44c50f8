"""The image formats deepdanbooru reads: one table that every other list is derived from (standard library only).

Adding a format means a row here, plus what no table can say: its header
parser (pipeline/header.py and preflight/images.py) and its decoder
(pipeline/decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageFormat:
    name: str                      # as the header parsers and bad_images.txt name it
    extensions: tuple[str, ...]    # file_ext values project.json and --folder-filters accept; the first is written
    also_stored_as: tuple[str, ...]  # further extensions seen in the wild (preflight does not warn on them)
    pillow: tuple[str, ...]        # Pillow's names for it (import-images)
    deepdanbooru: bool             # DeepDanbooru 1.0 trained on it: in the default image_extensions

    @property
    def extension(self) -> str:
        return self.extensions[0]


# In the order messages and docs list them.
IMAGE_FORMATS = (
    ImageFormat("png", ("png",), (), ("PNG",), True),
    # MPO is what cameras write: a JPEG whose first frame every JPEG decoder reads.
    ImageFormat("jpeg", ("jpg", "jpeg"), ("jpe", "jfif"), ("JPEG", "MPO"), True),
    ImageFormat("gif", ("gif",), (), ("GIF",), False),
    ImageFormat("webp", ("webp",), (), ("WEBP",), False),
    ImageFormat("bmp", ("bmp",), ("dib",), ("BMP",), False),
)

FORMAT_BY_NAME = {f.name: f for f in IMAGE_FORMATS}
IMAGE_EXTENSIONS = tuple(ext for f in IMAGE_FORMATS for ext in f.extensions)
DEEPDANBOORU_EXTENSIONS = tuple(ext for f in IMAGE_FORMATS if f.deepdanbooru for ext in f.extensions)
EXTENSION_BY_PILLOW_NAME = {pillow: f.extension for f in IMAGE_FORMATS for pillow in f.pillow}


def stored_extensions(name: str) -> tuple[str, ...]:
    """Every extension a file of format `name` is normally stored under."""
    image_format = FORMAT_BY_NAME[name]
    return image_format.extensions + image_format.also_stored_as


def folder_filters() -> str:
    """Glob patterns for every extension, spelled with character classes so that matching is
    case-insensitive on every file system, not just on Windows and macOS."""
    return ",".join("*." + "".join(f"[{c.upper()}{c}]" if c.isalpha() else c for c in ext)
                    for ext in IMAGE_EXTENSIONS)
