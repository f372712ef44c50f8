"""The run's curves as inline SVG, drawn by matplotlib (the `report` extra) without a display.

Text stays text (svg.fonttype "none"): the page's own font draws it and the SVG stays small; ids are
salted per chart so several charts inlined in one page never share an id.
"""

from __future__ import annotations

import io

from deepdanbooru.errors import DependencyError

# Validation figures drawn, with the label the page gives them.
VALIDATION_LINES = (
    ("map", "mAP"),
    ("macro_f1", "macro-F1 at the working threshold"),
    ("calibrated_macro_f1", "macro-F1 at per-tag thresholds"),
    ("pr_f1", "macro-F1 at P=R"),
)


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise DependencyError("deepdanbooru report draws its charts with matplotlib, which is not installed: "
                              "pip install 'deepdanbooru[report]'") from None
    return matplotlib


def _figure(width: float, height: float):
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def svg_of(figure, salt: str) -> str:
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # the XML prolog and DOCTYPE may not appear inside HTML


def _series(rows, key):
    points = [(row["used_minibatch"], row[key]) for row in rows if isinstance(row.get(key), (int, float))]
    return [x for x, _ in points], [y for _, y in points]


def _mark_stops(axes, stops):
    """A dotted line at each stop's step, named at its top (Ctrl-C, time limit, killed, pause)."""
    for step, label in stops:
        axes.axvline(step, color="#777777", linestyle=":", linewidth=1)
        # Above a legend that the line may cross, so that every stop stays named.
        axes.annotate(label, (step, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                      textcoords="offset points", rotation=90, va="top", ha="left", fontsize=7, color="#555555",
                      zorder=10, bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                                       "alpha": 0.85})


def run_charts(train_rows: list[dict], validation_rows: list[dict], stops: list[tuple[int, str]]) -> dict[str, str]:
    """{"loss", "validation", "learning_rate"}: SVG text of each chart that has data, drawn side by side on the
    page; `stops` are (step, label) where a run stopped and went on (dotted lines, named)."""
    charts = {}
    steps, loss = _series(train_rows, "loss")
    val_steps, val_loss = _series(validation_rows, "loss")
    if steps or val_steps:
        figure = _figure(4.2, 3.0)
        axes = figure.add_subplot()
        if steps:
            # A line needs two points: a run logged once (or twice) is drawn as its points.
            axes.plot(steps, loss, "o-" if len(steps) < 3 else "-", label="training", color="#1f77b4", markersize=3)
        if val_steps:
            axes.plot(val_steps, val_loss, "o-", label="validation", color="#d62728", markersize=3)
        axes.set(title="Loss", xlabel="step")
        axes.legend(fontsize="small")
        axes.grid(alpha=0.3)
        _mark_stops(axes, stops)
        charts["loss"] = svg_of(figure, "loss")
    if validation_rows:
        figure = _figure(4.2, 3.0)
        axes = figure.add_subplot()
        for key, label in VALIDATION_LINES:
            xs, ys = _series(validation_rows, key)
            if xs:
                axes.plot(xs, ys, "o-", label=label, markersize=3)
        axes.set(title="Validation", xlabel="step", ylim=(0, 1))
        axes.legend(fontsize="x-small")
        axes.grid(alpha=0.3)
        _mark_stops(axes, stops)
        charts["validation"] = svg_of(figure, "validation")
    steps, rates = _series(train_rows, "learning_rate")
    if steps:
        figure = _figure(4.2, 3.0)
        axes = figure.add_subplot()
        axes.plot(steps, rates, "o-" if len(steps) < 3 else "-", color="#2ca02c", markersize=3)
        axes.set(title="Learning rate", xlabel="step")
        axes.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        axes.grid(alpha=0.3)
        _mark_stops(axes, stops)
        charts["learning_rate"] = svg_of(figure, "learning_rate")
    return charts
