"""How big the report page gets, and how long it takes to build and open, at 10,000 tags x 50,000 pictures.

No training and no images: generated scores (Zipf-distributed tag frequencies, about 20 tags a picture,
positives scoring higher than negatives) go through the report's own collection and page code
(scoring.metrics.ValidationMetrics, report.collect, report.tables, report.page), as the scoring of a real
split feeds them. Thumbnails are not written; the bench counts how many the folder beside the page
would hold. With playwright and chromium installed it opens the page and times the table's first draw
and a sort.

    python bench/report_scale.py [--tags 10000] [--pictures 50000] [--output /tmp/report_scale.html]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from deepdanbooru.report import collect, page, summary, tables
from deepdanbooru.scoring.metrics import ValidationMetrics


class GeneratedRecords:
    """What tables.pictures_and_gallery reads of a split: ids and paths."""

    def __init__(self, count: int):
        self.ids = np.arange(1, count + 1)

    def path(self, position: int) -> str:
        return f"/nowhere/{position}.jpg"


def generated_batches(pictures: int, tags: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    frequency = np.minimum(0.5, 3.0 / np.arange(1, tags + 1) ** 0.75)  # about 20 tags a picture at 10,000 tags
    quality = rng.uniform(0.5, 3.0, tags)  # how well each tag separates
    for start in range(0, pictures, batch):
        rows = min(batch, pictures - start)
        labels = rng.random((rows, tags), dtype=np.float32) < frequency
        logits = rng.normal(-4.0, 1.5, (rows, tags)).astype(np.float32) + labels * (quality * 2.5).astype(np.float32)
        yield 1 / (1 + np.exp(-logits)), labels.astype(np.float32), np.arange(start, start + rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=10_000)
    parser.add_argument("--pictures", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--output", type=Path, default=Path("/tmp/report_scale.html"))
    options = parser.parse_args()
    started = time.monotonic()
    metrics = ValidationMetrics(options.tags)
    collector = collect.PageCollector(options.tags)
    train_counts = np.zeros(options.tags, dtype=np.int64)
    for scores, labels, positions in generated_batches(options.pictures, options.tags, options.batch):
        metrics.update(scores, labels)
        collector.update(scores, labels, positions)
        train_counts += labels.sum(axis=0).astype(np.int64) * 9
    collected = time.monotonic() - started
    result = metrics.result()
    thresholds, precision, recall = metrics.tag_curves(tables.CURVE_STEP)
    names = [f"tag_{index:05d}" for index in range(options.tags)]
    columns = tables.tag_columns(names, [0] * options.tags, train_counts, result["per_tag"]["support"], result)
    pictures, gallery, worst = tables.pictures_and_gallery(collector, result["per_tag"]["threshold"],
                                                           GeneratedRecords(options.pictures))
    for number, picture in enumerate(pictures):
        picture.pop("path")
        picture["thumb"] = f"report_files/{picture['id']}.jpg"
    data = {"tags": columns, "curves": tables.curve_arrays(thresholds, precision, recall), "pictures": pictures,
            "gallery": gallery, "worst": worst, "working_threshold": result["threshold"],
            "validation_pictures": options.pictures, "vocabulary": None}
    html = page.render("generated: 10,000 tags", [("Data", "generated scores")], summary.figure_rows(result), {},
                       data, None, "bench/report_scale.py")
    options.output.write_text(html, encoding="utf-8")
    built = time.monotonic() - started - collected
    size = options.output.stat().st_size
    print(f"{options.tags:,} tags x {options.pictures:,} pictures: page {size / 1e6:.1f} MB, {len(pictures):,} "
          f"thumbnails in the folder beside it; collecting {collected:.0f} s, building {built:.0f} s")
    print(f"  collector memory: {sum(a.nbytes for a in collector.positive_tags + collector.positive_scores + collector.negative_tags + collector.negative_scores) / 1e6:.0f} MB of per-picture arrays")
    try:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from browser import open_page  # noqa: E402
    except ImportError:
        return
    opened = time.monotonic()
    with open_page(options.output) as visit:
        visit.page.wait_for_selector("#tag-table tr.tag-row")
        loaded = time.monotonic() - opened
        rows = visit.page.locator("#tag-table tr.tag-row").count()
        sort = time.monotonic()
        visit.page.click('#tag-table th[data-key="ap"]')
        visit.page.wait_for_function("document.querySelector('#tag-table th.sorted-desc').dataset.key === 'ap'")
        sorted_in = time.monotonic() - sort
        opened_row = time.monotonic()
        visit.page.locator("#tag-table tr.tag-row").first.click()
        visit.page.wait_for_selector("svg.pr-curve")
        row_in = time.monotonic() - opened_row
        # The thumbnails were never written: their requests fail, and only those may.
        missing = [error for error in visit.console_errors if "ERR_FILE_NOT_FOUND" in error]
        errors = [error for error in visit.console_errors if error not in missing] + visit.page_errors
    print(f"  in chromium: table drawn {loaded:.1f} s after the load began ({rows} rows a page), sorted by AP in "
          f"{sorted_in:.2f} s, a tag's curve opened in {row_in:.2f} s; {len(missing)} thumbnails not found (none "
          f"written), other errors: {errors or 'none'}")


if __name__ == "__main__":
    main()
