"""The report page as a person sees it: opened from disk in headless Chromium (tests/browser.py)."""

import json

import pytest
from click.testing import CliRunner

from browser import blank, open_page
from deepdanbooru.cli import main
from test_report import tiny_model, trained


@pytest.fixture(scope="module")
def page(tmp_path_factory, sample_dataset):
    """A report written with --output outside the project, its thumbnails beside it."""
    database, tags = sample_dataset
    root = tmp_path_factory.mktemp("report_page")
    project = root / "project"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({
        "image_width": 32, "image_height": 32, "database_path": str(database), "minimum_tag_count": 1,
        "model": "resnet_small"}))
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    (project / "categories.json").write_text(json.dumps([{"name": "general", "start_index": 0},
                                                         {"name": "character", "start_index": 5}]))
    model = root / "model.keras"
    tiny_model(len(tags)).save(model)
    trained(project, tags, model)
    (root / "tags.json").write_text(json.dumps(tags))
    output = root / "out" / "page.html"
    output.parent.mkdir()
    result = CliRunner().invoke(main, ["report", str(project), "--output", str(output)])
    assert result.exit_code == 0, result.output
    assert (root / "out" / "page_files").is_dir()
    return output


def row_names(page_):
    return page_.eval_on_selector_all("#tag-table tr.tag-row", "rows => rows.map(r => r.dataset.tag)")


@pytest.mark.slow
def test_the_page_in_a_browser(page, tmp_path):
    with open_page(page) as visit:
        view = visit.page
        # Loaded with no error and nothing fetched but its own thumbnails.
        assert visit.console_errors == [] and visit.page_errors == []
        assert visit.network_requests == []
        assert any(url.endswith(".jpg") for url in visit.requests)
        assert view.eval_on_selector_all("img", "images => images.filter(i => !i.complete || !i.naturalWidth).length") == 0
        # Drawn: the charts, the table, the gallery; the screenshot is not blank.
        assert view.locator(".charts svg").count() == 3
        assert view.locator("#gallery .card").count() > 0
        assert view.locator("#gallery .tag.fp, #gallery .tag.fn").count() > 0
        # Every card holds its tags: none runs over into the card below it.
        overflowing = view.eval_on_selector_all("#gallery .card", "cards => cards.filter(c => c.scrollHeight > "
                                                "c.clientHeight + 1).map(c => c.dataset.post)")
        assert overflowing == []
        assert view.locator("#vocabulary-new tr").count() == len(row_names(view)) - 10  # the new tags
        assert view.locator('#tag-table th[data-key="source_ap"]').count() == 1
        assert not blank(view.screenshot(full_page=True, path=tmp_path / "page.png"))

        # Sorting: by validation posts (descending) first; a click on "tag" sorts by name, again reverses it.
        names = row_names(view)
        assert len(names) == len(set(names)) > 5
        view.click('#tag-table th[data-key="name"]')
        by_name = row_names(view)
        assert by_name == sorted(names) != names
        view.click('#tag-table th[data-key="name"]')
        assert row_names(view) == by_name[::-1]

        # Filtering by name keeps the matching rows only.
        needle = by_name[0][:3]
        view.fill("#tag-filter", needle)
        filtered = row_names(view)
        assert filtered and len(filtered) < len(names) and all(needle in name for name in filtered)
        assert f"of {len(filtered)} " in view.inner_text("#tag-count")
        view.fill("#tag-filter", "")
        # ... and by category.
        view.select_option("#tag-category", "character")
        characters = row_names(view)
        assert set(characters) == set(by_name) - set(json.loads((page.parent.parent / "tags.json").read_text())[:5])
        view.select_option("#tag-category", "")

        # A row opens its precision-recall curve and its worst pictures; a second click closes it.
        row = view.locator("#tag-table tr.tag-row").first
        row.click()
        detail = view.locator("#tag-table tr.tag-detail")
        assert detail.count() == 1
        assert detail.locator("svg.pr-curve polyline").count() == 1
        assert detail.locator("figure.thumb img").count() > 0
        row.click()
        assert view.locator("#tag-table tr.tag-detail").count() == 0
        assert visit.console_errors == [] and visit.page_errors == []
