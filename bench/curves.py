"""Line charts as PNG, drawn by matplotlib (the `report` extra) on its Agg canvas, without a display.

    line_chart(path, {"name": [(x, y), ...]}, x_label="minutes", y_label="macro-F1")
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

WIDTH, HEIGHT = 720, 440  # pixels
DPI = 100
# Distinct on white and for the common colour blindnesses (Okabe-Ito).
PALETTE = ((0, 114, 178), (213, 94, 0), (0, 158, 115), (204, 121, 167), (230, 159, 0), (86, 180, 233),
           (0, 0, 0), (240, 228, 66))


def line_chart(path, series: dict[str, list[tuple[float, float]]], *, title: str = "", x_label: str = "",
               y_label: str = "", y_range: tuple[float, float] | None = None) -> None:
    """Write a PNG with one line (and dots) per series, the legend outside on the right; x from 0."""
    figure = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (name, values) in enumerate(series.items()):
        colour = tuple(channel / 255 for channel in PALETTE[index % len(PALETTE)])
        points = sorted(values)
        axes.plot([x for x, _ in points], [y for _, y in points], "o-", color=colour, label=name, linewidth=2,
                  markersize=5)
    axes.set_xlim(left=0)
    if y_range is not None:
        axes.set_ylim(*y_range)
    axes.set(title=title, xlabel=x_label, ylabel=y_label)
    axes.grid(color="#e6e6e6")
    if series:
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    figure.savefig(path, format="png", dpi=DPI)
