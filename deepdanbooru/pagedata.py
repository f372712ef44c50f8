"""Data carried inside an HTML page, for its script to read: the one way every page of this package embeds JSON.

The page holds `<script type="application/json" id=ID>JSON</script>` and its script reads
`JSON.parse(document.getElementById(ID).textContent)`. The text between the tags is not HTML-escaped,
so the HTML parser ends the element early, or stops seeing its end, on what user text may hold (tag
names): "</script" ends it, and "<!--" followed by "<script" puts the parser in a state where the
closing "</script>" no longer counts, so the element swallows the page's own script. JSON's escapes
make such text impossible: every "<", ">" and "&" is written as \\u003c, \\u003e and \\u0026, which
JSON.parse reads back as the same characters (a backslash before "!" or "/" is not a JSON escape
everywhere, and "\\!" is not one at all). Standard library only.
"""

from __future__ import annotations

import json
import re

# Characters with a meaning to the HTML parser inside a <script> element, as JSON escapes.
_HTML_SIGNIFICANT = re.compile(r"[<>&]")


def script_json(payload) -> str:
    """`payload` as JSON text safe between <script type="application/json"> and </script>."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return _HTML_SIGNIFICANT.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def data_element(element_id: str, payload) -> str:
    """The element a page's script reads with JSON.parse(document.getElementById(element_id).textContent)."""
    if not re.fullmatch(r"[A-Za-z][\w-]*", element_id):
        raise ValueError(f"not a plain element id: {element_id!r}")
    return f'<script type="application/json" id="{element_id}">{script_json(payload)}</script>'
