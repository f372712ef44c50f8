"""PROJECT/audit.html: the suggestions with their pictures, to accept or reject, exported as a CSV.

One self-contained file (thumbnails inlined as JPEG data, no script or style fetched), so it opens
from the disk and never reaches the network. The export is a file in audit.csv's own format holding
the accepted rows, each exactly as audit.csv writes it; `deepdanbooru audit PROJECT --apply FILE`
takes it. Decisions are kept in the browser's storage for the page, so a reload keeps them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
from pathlib import Path

from PIL import Image

from deepdanbooru.audit.results import csv_text
from deepdanbooru.fileio import write_text_atomic

PAGE_FILE = "audit.html"
PAGE_ROWS = 2000  # the page's share of audit.csv; the file keeps every row
THUMBNAIL = 112
EXPORT_NAME = "audit-accepted.csv"
_HEADER = "".join(f"<th>{name}</th>" for name in ("rank", "picture", "post", "suggestion", "score", "the post's tags", ""))

_STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}td,th{padding:4px 8px;border-bottom:1px solid #ddd;text-align:left}
img{width:112px;height:112px;object-fit:contain;display:block}
.tags{max-width:22em;color:#555}
tr.accepted{background:#e4f6e4}tr.rejected{background:#f6e4e4;opacity:.6}
.missing{color:#05591b}.wrong{color:#8a1010}
.bar{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:2px solid #ccc}
button{margin-right:4px}
"""

_SCRIPT = """
const rows = JSON.parse(document.getElementById('audit-data').textContent);
const key = 'deepdanbooru-audit:' + rows.id;
const decisions = JSON.parse(localStorage.getItem(key) || '{}');
function show() {
  let accepted = 0, rejected = 0;
  document.querySelectorAll('tbody tr').forEach(tr => {
    const d = decisions[tr.dataset.rank];
    tr.className = d || '';
    accepted += d === 'accepted'; rejected += d === 'rejected';
  });
  document.getElementById('counts').textContent =
    `${accepted} accepted, ${rejected} rejected, ${rows.lines.length - accepted - rejected} undecided`;
  localStorage.setItem(key, JSON.stringify(decisions));
}
document.querySelector('tbody').addEventListener('click', event => {
  const button = event.target.closest('button');
  if (!button) return;
  const rank = button.closest('tr').dataset.rank;
  decisions[rank] = decisions[rank] === button.value ? undefined : button.value;
  show();
});
document.getElementById('accept-rest').addEventListener('click', () => {
  document.querySelectorAll('tbody tr').forEach(tr => { decisions[tr.dataset.rank] ||= 'accepted'; });
  show();
});
document.getElementById('export').addEventListener('click', () => {
  const chosen = rows.lines.filter((line, i) => decisions[rows.ranks[i]] === 'accepted');
  const blob = new Blob([rows.header + '\\n' + chosen.map(l => l + '\\n').join('')], {type: 'text/csv'});
  const link = document.createElement('a');
  link.href = URL.createObjectURL(blob);
  link.download = rows.file;
  link.click();
  URL.revokeObjectURL(link.href);
});
show();
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


def _row(suggestion, picture: str | None, tags: str) -> str:
    escape = html.escape
    image = f'<img src="{picture}" alt="post {suggestion.post_id}">' if picture else "(unreadable)"
    action = "add" if suggestion.kind == "missing" else "remove"
    return (f'<tr data-rank="{suggestion.rank}"><td>{suggestion.rank}</td><td>{image}</td>'
            f"<td>{suggestion.post_id}<br><small>{escape(suggestion.md5)}</small></td>"
            f'<td class="{suggestion.kind}">{action} <b>{escape(suggestion.tag)}</b><br><small>{suggestion.kind}'
            f'</small></td><td>{suggestion.score:.3f}</td><td class="tags"><small>{escape(tags)}</small></td>'
            '<td><button value="accepted">accept</button><button value="rejected">reject</button></td></tr>')


def page_html(title: str, suggestions, pictures: dict, tags: dict, page_id: str, total: int, project: str) -> str:
    lines = csv_text(suggestions).splitlines()
    data = {"id": page_id, "header": lines[0], "lines": lines[1:], "ranks": [s.rank for s in suggestions],
            "file": EXPORT_NAME}
    shown = "" if total == len(suggestions) else \
        f" The page shows the first {len(suggestions):,} of {total:,}; audit.csv holds them all."
    body = "\n".join(_row(s, pictures.get(s.post_id), tags.get(s.post_id, "")) for s in suggestions)
    payload = json.dumps(data).replace("</", "<\\/")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{total:,} suggestions, most likely a mistake first. <span class="missing">missing</span>: the picture
likely shows the tag, the post lacks it; <span class="wrong">wrong</span>: the post carries the tag, the
picture likely does not. score: the model's score for the tag, from a model that did not train on the post.{shown}</p>
<div class="bar"><span id="counts"></span> <button id="accept-rest">accept the undecided</button>
<button id="export">export accepted ({EXPORT_NAME})</button>
<small>then: deepdanbooru audit {html.escape(project)} --apply {EXPORT_NAME}</small></div>
<table><thead><tr>{_HEADER}</tr></thead><tbody>
{body}
</tbody></table>
<script type="application/json" id="audit-data">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_page(project_root: Path, suggestions, records) -> Path:
    shown = suggestions[:PAGE_ROWS]
    index_of = {post_id: index for index, post_id in enumerate(records.ids)}
    pictures, tags = {}, {}
    for suggestion in shown:
        if suggestion.post_id not in pictures:
            index = index_of[suggestion.post_id]
            pictures[suggestion.post_id] = thumbnail(records.path(index))
            tags[suggestion.post_id] = records.tag_strings[index]
    project_root = Path(project_root)
    # Decisions are stored per audit: a new audit's ranks start undecided.
    digest = hashlib.sha256(csv_text(shown).encode()).hexdigest()[:12]
    page_id = f"{project_root.resolve()}:{digest}"
    path = project_root / PAGE_FILE
    write_text_atomic(path, page_html(f"Tag audit of {project_root.resolve().name}", shown, pictures, tags, page_id,
                                      len(suggestions), str(project_root)))
    return path

