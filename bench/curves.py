"""Line charts as PNG with Pillow alone (matplotlib is not a dependency).

    line_chart(path, {"name": [(x, y), ...]}, x_label="minutes", y_label="macro-F1")
"""

from __future__ import annotations

import math

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 720, 440
MARGIN = {"left": 64, "right": 170, "top": 34, "bottom": 50}
# Distinct on white and for the common colour blindnesses (Okabe-Ito).
PALETTE = ((0, 114, 178), (213, 94, 0), (0, 158, 115), (204, 121, 167), (230, 159, 0), (86, 180, 233),
           (0, 0, 0), (240, 228, 66))


def _nice_step(span: float, ticks: int = 5) -> float:
    """1, 2 or 5 times a power of ten, giving about `ticks` intervals over span."""
    raw = span / ticks if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _ticks(low: float, high: float) -> list[float]:
    step = _nice_step(high - low)
    first = math.floor(low / step) * step
    values, value = [], first
    while value <= high + step * 1e-9:
        if value >= low - step * 1e-9:
            values.append(round(value, 10))
        value += step
    return values


def _label(value: float) -> str:
    return f"{value:g}"


def line_chart(path, series: dict[str, list[tuple[float, float]]], *, title: str = "", x_label: str = "",
               y_label: str = "", y_range: tuple[float, float] | None = None) -> None:
    """Write a PNG with one polyline (and dots) per series; x from 0 to the largest x."""
    image = Image.new("RGB", (WIDTH, HEIGHT), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    points = [p for values in series.values() for p in values]
    x_high = max((x for x, _ in points), default=1.0) or 1.0
    if y_range is None:
        ys = [y for _, y in points] or [0.0, 1.0]
        y_range = (min(0.0, min(ys)), max(ys) if max(ys) > 0 else 1.0)
    y_low, y_high = y_range
    left, top = MARGIN["left"], MARGIN["top"]
    right, bottom = WIDTH - MARGIN["right"], HEIGHT - MARGIN["bottom"]

    def at(x, y):
        return (left + (right - left) * x / x_high,
                bottom - (bottom - top) * (y - y_low) / ((y_high - y_low) or 1.0))

    for value in _ticks(0.0, x_high):
        x, _ = at(value, y_low)
        pen.line([(x, top), (x, bottom)], fill=(230, 230, 230))
        pen.text((x, bottom + 6), _label(value), fill=(0, 0, 0), font=font, anchor="ma")
    for value in _ticks(y_low, y_high):
        _, y = at(0.0, value)
        pen.line([(left, y), (right, y)], fill=(230, 230, 230))
        pen.text((left - 6, y), _label(value), fill=(0, 0, 0), font=font, anchor="rm")
    pen.rectangle([left, top, right, bottom], outline=(0, 0, 0))
    pen.text(((left + right) / 2, HEIGHT - 16), x_label, fill=(0, 0, 0), font=font, anchor="mm")
    pen.text((8, top - 18), y_label, fill=(0, 0, 0), font=font)
    pen.text(((left + right) / 2, 10), title, fill=(0, 0, 0), font=font, anchor="ma")
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        placed = [at(x, y) for x, y in sorted(values)]
        if len(placed) > 1:
            pen.line(placed, fill=colour, width=2)
        for x, y in placed:
            pen.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        legend_y = top + 6 + 18 * index
        pen.line([(right + 12, legend_y), (right + 34, legend_y)], fill=colour, width=3)
        pen.text((right + 40, legend_y), name, fill=(0, 0, 0), font=font, anchor="lm")
    image.save(path, format="PNG")
