"""What preflight's checks cost on a large project, against the obvious alternative.

1. md5 safety over every eligible row: our SQL scan (the records.check_md5 rule
   as an SQLite function, COUNT/MIN in one query) against a Python loop over
   records.iter_eligible (the rule applied row by row, as the loader does).
2. Image checks: inspect_image (signature and structure, no decode) against
   a full Pillow decode of the same files.

    python bench/preflight.py [--rows 1000000] [--images 100] [--size 512] [--keep DB]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from records import build  # noqa: E402  (bench/records.py: the same 1M-row posts table)

from deepdanbooru.dataset import records  # noqa: E402
from deepdanbooru.preflight import checks  # noqa: E402
from deepdanbooru.preflight.images import inspect_image  # noqa: E402


def best_of(function, repeat=3):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


def md5_scan(db: Path, scratch: Path) -> dict:
    project = scratch / "project"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({"database_path": str(db), "minimum_tag_count": 20}))
    (project / "tags.txt").write_text("tag_0\n")
    run = checks.Run(project)
    try:
        for _, check in checks.PROJECT_CHECKS[:5]:  # config, tags, model, database, eligible
            check(run)
        ours, (status, _) = best_of(lambda: checks.check_md5(run))
        assert status == checks.PASS

        def python_loop():
            return sum(1 for _ in records.iter_eligible(run.connection, db, 20, run.config.image_extensions))

        baseline, count = best_of(python_loop)
        assert count == run.eligible
    finally:
        run.close()
    return {"eligible": count, "ours_seconds": ours, "baseline_seconds": baseline}


def image_checks(count: int, size: int, scratch: Path) -> dict:
    from PIL import Image

    from deepdanbooru.sample.generator import generate_sample_dataset

    database, _ = generate_sample_dataset(scratch / "images", count=count, size=size)
    paths = records.load_records(database, 0).paths()

    def inspect_all():
        return [inspect_image(p).pixels for p in paths]

    def decode_all():
        pixels = []
        for p in paths:
            with Image.open(p) as image:
                image.load()
                pixels.append(image.width * image.height)
        return pixels

    ours, a = best_of(inspect_all)
    baseline, b = best_of(decode_all)
    assert a == b
    return {"images": count, "size": size, "ours_seconds": ours, "baseline_seconds": baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--images", type=int, default=100)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--keep", type=Path, help="reuse/keep the generated database at this path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        scratch = Path(name)
        db = args.keep or scratch / "posts.sqlite"
        if not db.exists():
            print(f"building {args.rows:,} rows in {db} ...", file=sys.stderr)
            build(db, args.rows)
        scan = md5_scan(db, scratch)
        images = image_checks(args.images, args.size, scratch)
    print(f"md5 safety, {scan['eligible']:,} eligible rows: SQL scan {scan['ours_seconds']:.2f} s, "
          f"Python loop {scan['baseline_seconds']:.2f} s, ratio {scan['ours_seconds'] / scan['baseline_seconds']:.2f}")
    print(f"image check, {images['images']} JPEGs {images['size']}x{images['size']}: inspect_image "
          f"{images['ours_seconds'] * 1e3 / images['images']:.3f} ms/image, Pillow decode "
          f"{images['baseline_seconds'] * 1e3 / images['images']:.3f} ms/image, "
          f"ratio {images['ours_seconds'] / images['baseline_seconds']:.3f}")
    print(json.dumps({
        "rows": args.rows,
        "eligible": scan["eligible"],
        "md5_sql_seconds": round(scan["ours_seconds"], 3),
        "md5_python_seconds": round(scan["baseline_seconds"], 3),
        "md5_ratio": round(scan["ours_seconds"] / scan["baseline_seconds"], 3),
        "images": images["images"],
        "image_size": images["size"],
        "inspect_ms_per_image": round(images["ours_seconds"] * 1e3 / images["images"], 4),
        "decode_ms_per_image": round(images["baseline_seconds"] * 1e3 / images["images"], 4),
        "image_ratio": round(images["ours_seconds"] / images["baseline_seconds"], 4),
    }))


if __name__ == "__main__":
    main()
