"""The HTML page: static sections written here, the tag table and gallery built in the page by page.js
from the JSON it carries. Scripts, styles and charts are inside the file; the thumbnails sit in one
folder beside it. Nothing is fetched from the network."""

from __future__ import annotations

from html import escape
from importlib import resources

from deepdanbooru.pagedata import data_element

CHART_ORDER = ("loss", "validation", "learning_rate")


# In every page's head: a later report replaces only a page that says it (make.py).
GENERATOR = "deepdanbooru report"

def _asset(name: str) -> str:
    return resources.files("deepdanbooru.report").joinpath(name).read_text(encoding="utf-8")


def _rows(rows) -> str:
    return "".join(f"<tr><th>{escape(label)}</th><td>{escape(text)}</td></tr>" for label, text in rows)


def _vocabulary(groups) -> str:
    if groups is None:
        return ""
    dropped = ", ".join(escape(tag) for tag in groups["dropped"][:200])
    more = len(groups["dropped"]) - 200
    return (
        '<h2 id="vocabulary">Grown vocabulary</h2>'
        f'<p>The source model\'s outputs were mapped onto tags.txt by name (logs/vocabulary.txt): '
        f'{len(groups["kept"]):,} tags kept, {len(groups["new"]):,} new (they started at their frequency\'s prior), '
        f'{len(groups["dropped"]):,} dropped.</p>'
        '<h3>How the new tags learned</h3>'
        '<table class="rows"><thead><tr><th>tag</th><th>training posts</th><th>validation posts</th><th>AP</th>'
        '<th>F1</th></tr></thead><tbody id="vocabulary-new"></tbody></table>'
        + (f'<p class="note">Dropped: {dropped}{f" and {more:,} more" if more > 0 else ""}</p>' if dropped else ""))


def render(title: str, run_rows, figure_rows, charts: dict, data: dict, vocabulary, notes) -> str:
    chart_html = "".join(f'<div class="chart" id="chart-{name}">{charts[name]}</div>'
                         for name in CHART_ORDER if name in charts)
    figures = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td><td>{escape(covers)}</td></tr>"
                      for name, value, covers in figure_rows)
    gallery_note = (f"The {len(data['gallery']):,} pictures with the most mistakes of {data['validation_pictures']:,} "
                    "scored, worst first (mistakes counted at each tag's threshold).")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="{GENERATOR}">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src 'self' data: file:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{escape(title)}</title><style>{_asset("page.css")}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="note">{escape(notes)}</p>
<h2 id="run">The run</h2>
<table class="rows">{_rows(run_rows)}</table>
<h2 id="figures">Figures of the reported model on the validation split</h2>
<table class="rows"><thead><tr><th>figure</th><th>value</th><th>over which tags, at which thresholds</th></tr></thead>
<tbody>{figures}</tbody></table>
<h2 id="curves">Curves over the run</h2>
<p class="note">By training step, across every resumed slice; dotted lines mark stops, named by what stopped the run.</p>
<div class="charts">{chart_html or '<p class="note">No history (logs/history.jsonl) to draw.</p>'}</div>
<h2 id="tags">Tags</h2>
<p class="note">Click a column to sort, a row to open its precision-recall curve and its worst pictures.
F1, precision and recall are at the tag's default threshold; "(fallback)" marks a tag without a reliable threshold
of its own (too few validation positives, a low AP or no gain over the working threshold), "(withheld)" one the
default thresholds never emit. Sorting by a figure puts such tags after the others: their figures rest on a few pictures.</p>
<div class="controls"><input id="tag-filter" type="search" placeholder="filter by name" aria-label="filter tags by name">
<select id="tag-category" aria-label="category"><option value="">every category</option></select>
<button id="tag-previous">previous</button><button id="tag-next">next</button><span id="tag-count" class="note"></span></div>
<table id="tag-table"><thead></thead><tbody></tbody></table>
<h2 id="pictures">Pictures</h2>
<p class="note">{escape(gallery_note)} <span class="legend"><span class="tag hit">caption tag predicted</span>
<span class="tag fn">FN: caption tag missed</span><span class="tag fp">FP: predicted, not in the caption</span></span></p>
<div id="gallery"></div>
{_vocabulary(vocabulary)}
{data_element("report-data", data)}
<script>{_asset("page.js")}</script>
</body></html>
"""
