"""The report page as a person sees it: opened from disk in headless Chromium (tests/browser.py)."""

import json

import pytest
from click.testing import CliRunner

from browser import blank, open_page
from deepdanbooru.cli import main
from test_report import page_data, tiny_model, trained


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
    # The source measured these validation posts: the page is written again with the row of what was kept.
    source_file = project / "logs" / "source_tag_ap.json"
    source_file.write_text(json.dumps({**json.loads(source_file.read_text()),
                                       "validation_records": page_data(output)[1]["validation_pictures"]}))
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
        kept = view.locator("tr", has=view.locator("th", has_text="source tags kept"))
        assert kept.count() == 1 and kept.is_visible()
        assert kept.locator("td").first.inner_text() == "not counted"  # a few validation posts: no tag has 10
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

        # The run's stops, in the run's table and named on its curves: the pause seen in the times only, and the
        # recorded Ctrl-C, though its pause (29 s) was too short to be seen in the times.
        stops = view.locator("table.rows tr", has=view.locator("th", has_text="Stops")).locator("td").inner_text()
        assert stops.startswith("2: a pause of 9:59 at step 5")
        assert "Ctrl-C at step 7, resumed from the checkpoint at step 6 after 0:29 (1 step trained again)" in stops
        for chart in ("loss", "validation", "learning_rate"):
            assert view.locator(f"#chart-{chart} svg text", has_text="Ctrl-C").count() == 1, chart

        # Sorting by AP: the tags with enough validation positives to calibrate first, then those whose AP rests
        # on a picture or two (their AP says how many), then those without a figure.
        data = page_data(page)[1]
        tags, minimum = data["tags"], data["min_support"]
        few = [0 < n < minimum for n in tags["validation"]]
        assert any(few)  # every tag here: the sample's split is small (the order among both kinds: below)
        view.click('#tag-table th[data-key="ap"]')
        shown = [tags["name"].index(name) for name in row_names(view)]
        assert [(tags["ap"][i] is None, few[i]) for i in shown] == sorted((tags["ap"][i] is None, few[i]) for i in shown)
        for group in (True, False):
            aps = [tags["ap"][i] for i in shown if few[i] == group and tags["ap"][i] is not None]
            assert aps == sorted(aps, reverse=True)
        cells = view.eval_on_selector_all("#tag-table tr.tag-row", "rows => rows.map(r => [r.dataset.tag, "
                                          "r.children[4].innerText, r.children[0].innerText])")
        for (name, ap_text, name_cell), i in zip(cells, shown):
            if few[i] and tags["ap"][i] is not None:
                assert ap_text.endswith(f" ({tags['validation'][i]} pos.)"), (name, ap_text)
                count = tags["validation"][i]
                assert (f"{count} validation positive{'' if count == 1 else 's'}, fewer than the {minimum} that "
                        f"calibrate: AP and F1 rest on {'one picture' if count == 1 else f'{count} pictures'}"
                        ) in name_cell
                if tags["f1"][i] != tags["f1_fixed"][i]:  # F1 at the fallback threshold beside F1 at the working one
                    at = ("no threshold (withheld: never emitted by default)" if tags["withheld"][i] else
                          f"the fallback threshold {tags['threshold'][i]:.3f}")
                    assert (f"is at {at} (fewer than {minimum} "
                            f"positives to choose its own); at {data['working_threshold']} it is "
                            f"{tags['f1_fixed'][i]:.3f}") in name_cell, name_cell
            else:
                assert name_cell == name and "pos." not in ap_text
        assert any(few[i] and tags["f1"][i] != tags["f1_fixed"][i] for i in shown)  # the case is shown
        view.screenshot(full_page=True, path=tmp_path.parent / "report_page_sorted_by_ap.png")
        assert visit.console_errors == [] and visit.page_errors == []


def test_sorting_by_a_figure_puts_the_tags_with_few_positives_after_the_others(tmp_path):
    """A page of crafted figures: a one-positive tag at AP 1.000 does not come first, and says why it reads so."""
    from deepdanbooru.report.page import render

    names = ["plenty_good", "one_positive", "plenty_poor", "two_positives", "none_in_split"]
    validation = [40, 1, 25, 2, 0]
    tags = {"name": names, "category": [""] * 5, "train": [90, 3, 60, 5, 1], "validation": validation,
            "ap": [0.9, 1.0, 0.4, 0.75, None], "f1": [0.8, 0.0, 0.35, 0.5, None],
            "precision": [0.8, 0.0, 0.3, 0.5, None], "recall": [0.8, 0.0, 0.4, 0.5, None],
            "threshold": [0.42, 0.62, 0.3, 0.62, 0.62], "calibrated": [True, False, True, False, False],
            "f1_fixed": [0.78, 1.0, 0.3, 0.5, None], "precision_fixed": [0.7, 1.0, 0.3, 0.5, None],
            "recall_fixed": [0.8, 1.0, 0.3, 0.5, None]}
    data = {"tags": tags, "curves": {"thresholds": [0.0, 0.5, 1.0], "precision": [[0, 0, 0]] * 5,
                                     "recall": [[0, 0, 0]] * 5},
            "pictures": [], "gallery": [], "worst": {"fp": [[]] * 5, "fn": [[]] * 5}, "working_threshold": 0.5,
            "global_threshold": 0.62, "min_support": 10, "validation_pictures": 50, "vocabulary": None}
    page = tmp_path / "page.html"
    page.write_text(render("crafted", [("Stops", "none")], [], {}, data, None, "notes"), encoding="utf-8")
    with open_page(page) as visit:
        view = visit.page
        view.click('#tag-table th[data-key="ap"]')
        assert row_names(view) == ["plenty_good", "plenty_poor", "one_positive", "two_positives", "none_in_split"]
        view.click('#tag-table th[data-key="ap"]')  # ascending: the few-positive tags still after the others
        assert row_names(view) == ["plenty_poor", "plenty_good", "two_positives", "one_positive", "none_in_split"]
        view.click('#tag-table th[data-key="f1_fixed"]')
        assert row_names(view) == ["plenty_good", "plenty_poor", "one_positive", "two_positives", "none_in_split"]
        view.click('#tag-table th[data-key="validation"]')  # a count, not a figure: no grouping
        assert row_names(view) == ["plenty_good", "plenty_poor", "two_positives", "one_positive", "none_in_split"]
        rows = dict(view.eval_on_selector_all("#tag-table tr.tag-row", "rows => rows.map(r => [r.dataset.tag, "
                                              "Array.from(r.children).map(c => c.innerText)])"))
        one = rows["one_positive"]
        assert one[0] == ("one_positive\n1 validation positive, fewer than the 10 that calibrate: AP and F1 rest on "
                          "one picture\n"
                          "F1 0.000 is at the fallback threshold 0.620 (fewer than 10 positives to choose its own); "
                          "at 0.5 it is 1.000")
        assert (one[4], one[5], one[8], one[9]) == ("1.000 (1 pos.)", "0.000", "0.620 (fallback)", "1.000")
        assert rows["two_positives"][0] == ("two_positives\n2 validation positives, fewer than the 10 that calibrate: "
                                            "AP and F1 rest on 2 pictures")
        assert rows["plenty_good"][0] == "plenty_good" and rows["plenty_good"][4] == "0.900"
        view.screenshot(full_page=True, path=tmp_path.parent / "report_few_positives.png")
        assert visit.console_errors == [] and visit.page_errors == []
