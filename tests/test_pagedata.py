"""The JSON a page carries for its script: any text a tag may hold reads back the same, in a real browser too."""

import json
import re

import pytest

from browser import open_page
from deepdanbooru.pagedata import data_element, script_json

# Text that ends or hides a <script> element's end when written into it as it is.
HOSTILE = ["<!--", "<script", "</script>", "<!--<script>", "a&amp;b", "-->", "]]>", "\u2028", "<\\/", "x\\"]


def test_script_json_reads_back_the_same_and_holds_nothing_the_html_parser_sees():
    payload = {"tags": HOSTILE, "nested": {"<!--": [1, 0.5, None, True]}}
    text = script_json(payload)
    assert json.loads(text) == payload
    assert not re.search(r"[<>&]", text)
    assert data_element("page-data", payload).startswith('<script type="application/json" id="page-data">{')
    with pytest.raises(ValueError):
        data_element('x"><script>', payload)
    with pytest.raises(ValueError):
        script_json({"score": float("nan")})  # JSON.parse has no NaN: refused here, not in the reader's browser


def report_data(names):
    """The report page's data for tags `names`, one validation picture missing the first two."""
    count = len(names)
    columns = {"name": names, "category": ["general"] * count, "train": [3] * count, "validation": [1] * count,
               "calibrated": [True] * count}
    for key in ("ap", "f1", "precision", "recall", "threshold", "f1_fixed", "precision_fixed", "recall_fixed"):
        columns[key] = [0.5] * count
    picture = {"id": 7, "hits": [[2, 0.9]], "missed": [[0, 0.1], [1, 0.2]], "wrong": [], "more_wrong": False,
               "errors": 2}
    return {"tags": columns, "curves": {"thresholds": [0.5], "precision": [[500]] * count,
                                        "recall": [[500]] * count},
            "pictures": [picture], "gallery": [0], "worst": {"fp": [[] for _ in names], "fn": [[[0, 0.1]]] * count},
            "working_threshold": 0.5, "validation_pictures": 1, "vocabulary": None}


def test_the_report_page_shows_every_tag_whatever_text_the_tags_hold(tmp_path):
    from deepdanbooru.report.page import render

    first = "<!--"
    names = [first, "<!--<script>", "</script><b>", "<script>alert(1)</script>", "plain_tag"]
    page = tmp_path / "report.html"
    page.write_text(render("tags", [("Model", "m")], [], {}, report_data(names), None, "note"), encoding="utf-8")
    with open_page(page) as visit:
        view = visit.page
        assert visit.page_errors == [] and visit.console_errors == []
        shown = view.eval_on_selector_all("#tag-table tr.tag-row", "rows => rows.map(r => r.dataset.tag)")
        assert sorted(shown) == sorted(names)
        assert view.locator("#gallery .card").count() == 1
        assert view.locator("#gallery .tag.fn").all_inner_texts()[0].startswith(first)
        assert view.locator("#gallery script, #tag-table script").count() == 0  # shown as text, never run
        view.screenshot(path=str(tmp_path / "report.png"), full_page=True)



def test_the_audit_page_works_whatever_text_the_tags_hold(tmp_path):
    from deepdanbooru.audit.page import page_html
    from deepdanbooru.audit.results import Suggestion

    names = ["<!--", "<script>", "</script><b>x", "plain"]
    suggestions = [Suggestion(10 + rank, "0" * 32, name, rank % 2, 0.9, rank) for rank, name in enumerate(names, 1)]
    page = tmp_path / "audit.html"
    page.write_text(page_html("audit", suggestions, {}, {s.post_id: s.tag for s in suggestions}, "id", "project"), encoding="utf-8")
    with open_page(page) as visit:
        view = visit.page
        assert visit.page_errors == [] and visit.console_errors == []
        assert f"0 accepted, 0 rejected, {len(names)} undecided" in view.inner_text("#counts")
        assert [text.split("\n")[0] for text in view.locator("tbody td.suggestion b").all_inner_texts()] == names
