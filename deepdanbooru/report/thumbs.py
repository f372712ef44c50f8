"""Small JPEG copies of the pictures the page shows, in the folder beside it (Pillow)."""

from __future__ import annotations

from pathlib import Path

SIZE = 128  # longest side, pixels
QUALITY = 80


def write_thumbnail(source: str, target: Path) -> str | None:
    """Writes target; None when done, else why the picture could not be read (the page then shows the reason)."""
    from PIL import Image, ImageOps

    try:
        with Image.open(source) as image:
            image.draft("RGB", (SIZE, SIZE))  # JPEG: decode at a reduced scale, much faster for large originals
            image = ImageOps.exif_transpose(image)
            if image.mode in ("RGBA", "LA", "P"):
                image = image.convert("RGBA")
                background = Image.new("RGBA", image.size, "white")
                image = Image.alpha_composite(background, image)
            image = image.convert("RGB")
            image.thumbnail((SIZE, SIZE))
            image.save(target, "JPEG", quality=QUALITY)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        return str(error) or type(error).__name__
    return None
