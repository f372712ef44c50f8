"""Small test images in every format the pipeline must read, written with Pillow."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

HEIGHT, WIDTH = 40, 48
# Four solid quadrants: decoded colours can be checked after lossy coding and resampling.
QUADRANT_COLOURS = np.array([[[220, 30, 40], [30, 200, 60]], [[40, 60, 210], [230, 220, 50]]], np.uint8)


def quadrant_image(height=HEIGHT, width=WIDTH) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    for row in range(2):
        for col in range(2):
            image[row * height // 2:(row + 1) * height // 2, col * width // 2:(col + 1) * width // 2] = \
                QUADRANT_COLOURS[row, col]
    return image


def gray_of(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L"))


def _encode(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, **options)
    return buffer.getvalue()


def _with_alpha(rgb: np.ndarray, alpha=255) -> Image.Image:
    return Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], alpha, np.uint8)]), "RGBA")


def _frames(rgb: np.ndarray, mode="RGB"):
    # Later frames differ completely, so a decoder returning the wrong frame fails the colour check.
    later = [255 - rgb, np.roll(rgb, 7, axis=1)]
    if mode == "RGBA":
        return _with_alpha(rgb), [_with_alpha(f) for f in later]
    return Image.fromarray(rgb), [Image.fromarray(f) for f in later]


def encoded_variants(rgb: np.ndarray) -> dict[str, tuple[bytes, np.ndarray, int]]:
    """name -> (encoded bytes, expected RGB uint8, tolerance in levels for the quadrant means)."""
    gray = gray_of(rgb)
    gray_rgb = np.repeat(gray[..., None], 3, axis=2)
    image = Image.fromarray(rgb)
    sixteen = Image.fromarray(gray.astype(np.uint16) * 257)  # 16-bit grayscale, same picture
    first, rest = _frames(rgb)
    first_rgba, rest_rgba = _frames(rgb, "RGBA")
    return {
        "jpeg_baseline": (_encode(image, format="JPEG", quality=95), rgb, 12),
        "jpeg_progressive": (_encode(image, format="JPEG", quality=95, progressive=True), rgb, 12),
        "jpeg_grayscale": (_encode(Image.fromarray(gray), format="JPEG", quality=95), gray_rgb, 12),
        "jpeg_cmyk": (_encode(image.convert("CMYK"), format="JPEG", quality=95), rgb, 16),
        "png_rgb": (_encode(image, format="PNG"), rgb, 1),
        "png_rgba": (_encode(_with_alpha(rgb, 128), format="PNG"), rgb, 1),
        "png_palette": (_encode(image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), format="PNG"), rgb, 2),
        "png_gray": (_encode(Image.fromarray(gray), format="PNG"), gray_rgb, 1),
        "png_gray_alpha": (_encode(Image.fromarray(np.dstack([gray, np.full_like(gray, 200)]), "LA"), format="PNG"),
                           gray_rgb, 1),
        "png_16bit": (_encode(sixteen, format="PNG"), gray_rgb, 1),
        "gif_animated": (_encode(first.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), format="GIF",
                                 save_all=True, append_images=[f.convert("P") for f in rest], duration=50),
                         rgb, 3),
        "bmp": (_encode(image, format="BMP"), rgb, 1),
        "webp_lossy": (_encode(image, format="WEBP", quality=95), rgb, 16),
        "webp_lossless": (_encode(image, format="WEBP", lossless=True), rgb, 1),
        "webp_alpha": (_encode(_with_alpha(rgb, 128), format="WEBP", lossless=True), rgb, 1),
        "webp_animated": (_encode(first, format="WEBP", save_all=True, append_images=rest, duration=50,
                                  lossless=True), rgb, 1),
        "webp_animated_lossy": (_encode(first, format="WEBP", save_all=True, append_images=rest, duration=50,
                                        quality=95), rgb, 16),
        "webp_animated_alpha": (_encode(first_rgba, format="WEBP", save_all=True, append_images=rest_rgba,
                                        duration=50, lossless=True), rgb, 1),
    }


def quadrant_means(image: np.ndarray) -> np.ndarray:
    """Mean colour of each quadrant's interior (edges excluded: lossy codecs smear them)."""
    height, width = image.shape[:2]
    means = np.zeros((2, 2, 3))
    for row in range(2):
        for col in range(2):
            top, left = row * height // 2, col * width // 2
            inner = image[top + height // 8: top + height // 2 - height // 8,
                          left + width // 8: left + width // 2 - width // 8]
            means[row, col] = inner.reshape(-1, 3).mean(axis=0)
    return means
