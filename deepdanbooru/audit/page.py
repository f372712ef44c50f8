"""PROJECT/audit.html: the suggestions with their pictures, to accept or reject, exported as a CSV.

One self-contained file (thumbnails inlined as JPEG data, no script or style fetched), so it opens
from the disk and never reaches the network. Every row of audit.csv is on the page, a page of rows
at a time, with filters by kind, tag, probability and decision. The export is a file in audit.csv's
own format holding the accepted rows, each exactly as audit.csv writes it; `deepdanbooru audit
PROJECT --apply FILE` takes it. Decisions are kept in the browser's storage for the page, so a
reload keeps them.

The head says what the audit found about itself (audit/audit.json): the estimated number of label
errors, each scoring model's figures on the posts it did not see, the tags it could not audit, and its
warnings (models too weak for their suggestions to mean much, folds stopped early).

Each row says what the model gave ("the model gives 0.13"), never more than that figure holds. Its
probability is the audit's estimate that the post's label is wrong, where the audit records one; a
record without it is filtered on the model's score against the label instead (the score for a missing
tag, one minus it for a wrong one), and the page says so.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
from pathlib import Path

from PIL import Image

from deepdanbooru.audit.results import csv_text
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.pagedata import data_element
from deepdanbooru.wording import plural

PAGE_FILE = "audit.html"
PAGE_ROWS = 50  # rows on one page of the table; the file holds every row
THUMBNAIL = 112
EXPORT_NAME = "audit-accepted.csv"
BAR_FROM = 1000  # pictures to thumbnail before a progress bar is worth showing

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}
img{width:112px;height:112px;object-fit:contain;display:block}
td.suggestion{min-width:18em}.tags{max-width:22em;color:#555}.number{text-align:right;font-variant-numeric:tabular-nums}
tr.accepted{background:#e4f6e4}tr.rejected{background:#f6e4e4;opacity:.6}
.missing{color:#05591b}.wrong{color:#8a1010}.note{color:#555}
.warning{background:#fff4d6;border-left:4px solid #d99a00;padding:.4em .6em}
.bar{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:2px solid #ccc;z-index:1}
.bar div{margin:.25em 0}.bar label{margin-right:1em}
button{margin-right:4px}
"""

_SCRIPT = r"""
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("audit-data").textContent);
  const rows = data.rows, count = rows.rank.length, PAGE = data.page_rows;
  const key = "deepdanbooru-audit:" + data.id;
  let decisions = {};
  try { decisions = JSON.parse(localStorage.getItem(key) || "{}") || {}; } catch (error) { decisions = {}; }
  const state = { kind: "", tag: "", least: 0, decision: "", page: 0, shown: [] };
  // What the probability filter reads: the audit's estimate, else the model's score against the label.
  const figure = i => rows.probability ? rows.probability[i] : (rows.given[i] ? 1 - rows.score[i] : rows.score[i]);
  const decided = i => decisions[rows.rank[i]] || "";
  const n = number => number.toLocaleString("en-US");

  function el(name, attributes, ...children) {
    const node = document.createElement(name);
    for (const [name_, value] of Object.entries(attributes || {})) node.setAttribute(name_, value);
    for (const child of children) node.append(child);
    return node;
  }

  const perTag = new Map();
  for (let i = 0; i < count; i++) perTag.set(rows.tag[i], (perTag.get(rows.tag[i]) || 0) + 1);
  const tagSelect = document.getElementById("filter-tag");
  for (const [tag, n] of [...perTag].sort((a, b) => b[1] - a[1] || (data.tags[a[0]] < data.tags[b[0]] ? -1 : 1)))
    tagSelect.append(el("option", { value: String(tag) }, `${data.tags[tag]} (${n})`));

  function matching() {
    const shown = [];
    for (let i = 0; i < count; i++) {
      if (state.kind && (rows.given[i] ? "wrong" : "missing") !== state.kind) continue;
      if (state.tag !== "" && String(rows.tag[i]) !== state.tag) continue;
      if (figure(i) < state.least) continue;
      if (state.decision && (decided(i) || "undecided") !== state.decision) continue;
      shown.push(i);
    }
    return shown;
  }

  function row(i) {
    const given = rows.given[i], tag = data.tags[rows.tag[i]], post = data.posts[rows.post[i]] || {};
    const score = rows.score[i].toFixed(2);
    const picture = post.thumb ? el("img", { src: post.thumb, alt: "post " + rows.post[i] }) : "(unreadable)";
    const said = given ? `the post carries it; the model gives ${score}` : `the post lacks it; the model gives ${score}`;
    const cells = [
      el("td", { class: "number" }, String(rows.rank[i])), el("td", {}, picture),
      el("td", {}, String(rows.post[i]), el("br"), el("small", { title: "md5 " + rows.md5[i] }, rows.md5[i].slice(0, 8) + "\u2026")),
      el("td", { class: "suggestion " + (given ? "wrong" : "missing") }, given ? "remove " : "add ", el("b", {}, tag),
         el("br"), el("small", {}, said)),
    ];
    if (rows.probability) cells.push(el("td", { class: "number probability" }, rows.probability[i].toFixed(2)));
    cells.push(el("td", { class: "tags" }, el("small", {}, post.tags || "")),
               el("td", {}, el("button", { value: "accepted" }, "accept"), el("button", { value: "rejected" }, "reject")));
    const tr = el("tr", { "data-rank": String(rows.rank[i]) }, ...cells);
    tr.className = decided(i);
    return tr;
  }

  function show() {
    state.shown = matching();
    const pages = Math.max(1, Math.ceil(state.shown.length / PAGE));
    state.page = Math.max(0, Math.min(state.page, pages - 1));
    const start = state.page * PAGE, slice = state.shown.slice(start, start + PAGE);
    document.querySelector("tbody").replaceChildren(...slice.map(row));
    let accepted = 0, rejected = 0;
    for (let i = 0; i < count; i++) { const d = decided(i); accepted += d === "accepted"; rejected += d === "rejected"; }
    document.getElementById("counts").textContent =
      `${n(accepted)} accepted, ${n(rejected)} rejected, ${n(count - accepted - rejected)} undecided`;
    const span = slice.length ? `rows ${n(start + 1)}\u2013${n(start + slice.length)}` : "no row";
    document.getElementById("shown").textContent = `${span} of the ${n(state.shown.length)} the filters keep ` +
      `(${n(count)} in all), page ${n(state.page + 1)} of ${n(pages)}`;
    const open = state.shown.filter(i => !decided(i)).length;
    const rest = document.getElementById("accept-rest");
    rest.textContent = `accept the ${n(open)} undecided rows the filters keep`;
    rest.disabled = open === 0;
    document.getElementById("previous").disabled = state.page === 0;
    document.getElementById("next").disabled = state.page >= pages - 1;
    const jump = document.getElementById("page-number");
    jump.max = pages;
    if (document.activeElement !== jump) jump.value = state.page + 1;
    try { localStorage.setItem(key, JSON.stringify(decisions)); } catch (error) { /* storage full or off */ }
  }

  const refilter = (name, read) => event => { state[name] = read(event.target); state.page = 0; show(); };
  document.getElementById("filter-kind").addEventListener("change", refilter("kind", t => t.value));
  tagSelect.addEventListener("change", refilter("tag", t => t.value));
  document.getElementById("filter-decision").addEventListener("change", refilter("decision", t => t.value));
  document.getElementById("filter-least").addEventListener("input",
    refilter("least", t => (Number.isFinite(t.valueAsNumber) ? t.valueAsNumber : 0)));
  document.getElementById("previous").addEventListener("click", () => { state.page--; show(); });
  document.getElementById("next").addEventListener("click", () => { state.page++; show(); });
  document.getElementById("page-number").addEventListener("change", event => {
    if (Number.isFinite(event.target.valueAsNumber)) { state.page = Math.round(event.target.valueAsNumber) - 1; show(); }
    event.target.value = state.page + 1;
  });
  document.querySelector("tbody").addEventListener("click", event => {
    const button = event.target.closest("button");
    if (!button) return;
    const rank = button.closest("tr").dataset.rank;
    if (decisions[rank] === button.value) delete decisions[rank]; else decisions[rank] = button.value;
    show();
  });
  document.getElementById("accept-rest").addEventListener("click", () => {
    for (const i of state.shown) if (!decided(i)) decisions[rows.rank[i]] = "accepted";
    show();
  });
  document.getElementById("export").addEventListener("click", () => {
    const chosen = [];
    for (let i = 0; i < count; i++) if (decided(i) === "accepted") chosen.push(data.lines[i] + "\n");
    const blob = new Blob([data.header + "\n" + chosen.join("")], { type: "text/csv" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = data.file;
    link.click();
    URL.revokeObjectURL(link.href);
  });
  show();
})();
"""


def thumbnail(path) -> str | None:
    """A small JPEG of the picture as a data: URL; None when it cannot be read."""
    try:
        with Image.open(path) as image:
            image.thumbnail((THUMBNAIL, THUMBNAIL))
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, format="JPEG", quality=85)
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _probabilities(suggestions) -> list[float] | None:
    """Each row's estimated probability that its label is wrong, when the audit recorded one for every row."""
    values = [getattr(suggestion, "probability", None) for suggestion in suggestions]
    if not values or any(value is None for value in values):
        return None
    return [round(float(value), 4) for value in values]


def page_data(suggestions, pictures: dict, tags: dict, page_id: str) -> dict:
    """What the page's script reads: the rows as column arrays, tag names once, one thumbnail per post."""
    lines = csv_text(suggestions).splitlines()
    names = list(dict.fromkeys(suggestion.tag for suggestion in suggestions))
    index = {name: number for number, name in enumerate(names)}
    rows = {"rank": [s.rank for s in suggestions], "post": [s.post_id for s in suggestions],
            "md5": [s.md5 for s in suggestions], "tag": [index[s.tag] for s in suggestions],
            "given": [s.given for s in suggestions], "score": [round(float(s.score), 4) for s in suggestions],
            "probability": _probabilities(suggestions)}
    posts = {str(post_id): {"thumb": pictures.get(post_id), "tags": tags.get(post_id, "")}
             for post_id in dict.fromkeys(s.post_id for s in suggestions)}
    return {"id": page_id, "header": lines[0], "lines": lines[1:], "file": EXPORT_NAME, "page_rows": PAGE_ROWS,
            "tags": names, "rows": rows, "posts": posts}


def audit_notes(record: dict) -> tuple[list[str], list[str]]:
    """(what the audit found, its warnings) from audit/audit.json, for the page's head: the estimated number of
    label errors, each scoring model's figures on the posts it did not see, the tags not audited. A record
    without these (an older audit) gives none."""
    notes = []
    estimated = record.get("estimated_errors")
    if isinstance(estimated, (int, float)):
        notes.append(f"About {plural(round(estimated), 'label error')} estimated over the audited tags.")
    for figures in record.get("validation") or ():
        if not isinstance(figures, dict) or not figures.get("model"):
            continue
        shown = {key: "\u2013" if figures.get(key) is None else f"{figures[key]:.2f}" for key in ("map", "mean_auc")}
        posts = f" on the {figures['posts']:,} posts it did not see" if isinstance(figures.get("posts"), int) else ""
        notes.append(f"{Path(str(figures['model'])).name}: mAP {shown['map']}, mean AUC {shown['mean_auc']}{posts}.")
    skipped = record.get("skipped_tags") or ()
    if skipped:
        notes.append(f"{plural(len(skipped), 'tag')} not audited: their scores cannot separate the posts that carry them "
                     "(audit/audit.json names them with their figure).")
    warnings = [str(text) for text in record.get("warnings") or () if text]
    return notes, warnings


def _wording(probability: bool) -> tuple[str, str, str]:
    """(the figure's column header, what the probability filter reads, the paragraph saying what the figures are)."""
    scores = ("The model's score: what the model gives the tag on the picture (0 to 1), from a model that did "
              "not train on the post.")
    if probability:
        return ("probability wrong", "estimated probability the label is wrong at least",
                f"{scores} probability wrong: the audit's estimate that the post's label is a mistake, highest "
                "first.")
    return ("", "the model's score against the label at least",
            f"{scores} Rows are in the audit's order; the filter reads the score for a missing tag and one minus it "
            "for a wrong one (the model's own figure, not a calibrated probability).")


def page_html(title: str, suggestions, pictures: dict, tags: dict, page_id: str, project: str,
              record: dict | None = None) -> str:
    data = page_data(suggestions, pictures, tags, page_id)
    notes, warnings = audit_notes(record or {})
    found = (f'<p class="note">{html.escape(" ".join(notes))}</p>' if notes else "") + "".join(
        f'<p class="warning">warning: {html.escape(text)}</p>' for text in warnings)
    column, least, explained = _wording(data["rows"]["probability"] is not None)
    names = ("rank", "picture", "post", "suggestion") + ((column,) if column else ()) + ("the post's tags", "")
    header = "".join(f"<th>{name}</th>" for name in names)
    escape = html.escape
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{escape(title)}</title><style>{_STYLE}</style></head>
<body><h1>{escape(title)}</h1>
<p>{len(suggestions):,} suggestions. <span class="missing">missing</span>: the post lacks the tag;
<span class="wrong">wrong</span>: the post carries the tag. {escape(explained)}</p>
{found}
<div class="bar">
<div><label>kind <select id="filter-kind"><option value="">every kind</option>
<option value="missing">missing (add the tag)</option><option value="wrong">wrong (remove the tag)</option></select></label>
<label>tag <select id="filter-tag"><option value="">every tag</option></select></label>
<label>{escape(least)} <input id="filter-least" type="number" min="0" max="1" step="0.05" value="0"></label>
<label>decision <select id="filter-decision"><option value="">any</option><option value="undecided">undecided</option>
<option value="accepted">accepted</option><option value="rejected">rejected</option></select></label></div>
<div><button id="previous">previous</button><button id="next">next</button>
<label>page <input id="page-number" type="number" min="1" value="1" style="width:5em"></label>
<span id="shown" class="note"></span></div>
<div><span id="counts"></span> <button id="accept-rest">accept the undecided</button>
<button id="export">export accepted ({EXPORT_NAME})</button>
<small>then: deepdanbooru audit {escape(project)} --apply {EXPORT_NAME}</small></div></div>
<table><thead><tr>{header}</tr></thead><tbody></tbody></table>
{data_element("audit-data", data)}
<script>{_SCRIPT}</script>
</body></html>
"""


def write_page(project_root: Path, suggestions, records, summary: dict | None = None) -> Path:
    """audit.html; `summary`: what the audit found about itself, as audit/audit.json records it (its head notes)."""
    from deepdanbooru.report.progress import Bar

    index_of = {post_id: index for index, post_id in enumerate(records.ids)}
    posts = list(dict.fromkeys(suggestion.post_id for suggestion in suggestions))
    # About 1 ms a picture: a bar only where the wait shows (2,752 pictures took 2.6 s).
    bar = Bar(f"Thumbnails for {PAGE_FILE}", len(posts)) if len(posts) >= BAR_FROM else None
    pictures, tags = {}, {}
    for done, post_id in enumerate(posts, start=1):
        index = index_of[post_id]
        pictures[post_id] = thumbnail(records.path(index))
        tags[post_id] = records.tag_strings[index]
        if bar is not None:
            bar.update(done)
    if bar is not None:
        bar.close()
    project_root = Path(project_root)
    # Decisions are stored per audit: a new audit's ranks start undecided.
    digest = hashlib.sha256(csv_text(suggestions).encode()).hexdigest()[:12]
    page_id = f"{project_root.resolve()}:{digest}"
    path = project_root / PAGE_FILE
    write_text_atomic(path, page_html(f"Tag audit of {project_root.resolve().name}", suggestions, pictures, tags,
                                      page_id, str(project_root), summary))
    return path
