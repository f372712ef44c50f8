"""Loading eligible records from a large posts table: ours vs a DeepDanbooru-style loader.

Builds a posts table of --rows rows (default 1,000,000) once, then loads the
eligible records in two fresh subprocesses and reports seconds and peak memory
(tracemalloc peak of Python allocations, and the process's max RSS growth).

    python bench/records.py [--rows 1000000] [--keep DB]

The DeepDanbooru-style loader keeps sqlite3.Row objects (row_factory) and builds
a (path, tag_string) tuple per record, as DeepDanbooru 1.0 does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, resource, sqlite3, sys, time, tracemalloc
sys.path.insert(0, sys.argv[3])
mode, db = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
start = time.perf_counter()
if mode == "ours":
    from deepdanbooru.dataset.records import load_records
    records = load_records(db, 20)
    count = len(records)
else:
    connection = sqlite3.connect(db)
    connection.row_factory = sqlite3.Row
    rows = connection.execute(
        "SELECT md5, file_ext, tag_string FROM posts WHERE (file_ext = 'png' OR file_ext = 'jpg' OR "
        "file_ext = 'jpeg') AND (tag_count_general >= ?) ORDER BY id", (20,)).fetchall()
    records = [(f"images/{r['md5'][0:2]}/{r['md5']}.{r['file_ext']}", r["tag_string"]) for r in rows]
    count = len(records)
seconds = time.perf_counter() - start
_, peak = tracemalloc.get_traced_memory()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps({"count": count, "seconds": seconds, "peak_bytes": peak, "rss_growth_bytes": rss * 1024}))
"""


def build(path: Path, rows: int) -> None:
    rng = random.Random(0)
    vocabulary = [f"tag_{i}" for i in range(5000)]
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER, rating TEXT, score INTEGER, is_deleted INTEGER)")
    batch = []
    for post_id in range(1, rows + 1):
        count = rng.randint(5, 60)
        tags = " ".join(rng.sample(vocabulary, count))
        md5 = hashlib.md5(str(post_id).encode()).hexdigest()
        ext = rng.choice(("jpg", "jpg", "jpg", "png", "gif", "webp"))
        batch.append((post_id, md5, ext, tags, count, "g", 0, 0))
        if len(batch) == 50_000:
            connection.executemany("INSERT INTO posts VALUES (?,?,?,?,?,?,?,?)", batch)
            batch.clear()
    connection.executemany("INSERT INTO posts VALUES (?,?,?,?,?,?,?,?)", batch)
    connection.commit()
    connection.close()


def measure(mode: str, db: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, mode, str(db), str(ROOT)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="reuse/keep the generated database at this path")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        db = args.keep or Path(scratch) / "posts.sqlite"
        if not db.exists():
            print(f"building {args.rows:,} rows in {db} ...", file=sys.stderr)
            build(db, args.rows)
        ours = measure("ours", db)
        theirs = measure("deepdanbooru", db)
    assert ours["count"] == theirs["count"]
    mib = 1024 * 1024
    for name, result in (("ours", ours), ("deepdanbooru-style", theirs)):
        print(f"{name:>20}: {result['count']:,} records in {result['seconds']:.2f} s, "
              f"tracemalloc peak {result['peak_bytes'] / mib:.0f} MiB, RSS growth {result['rss_growth_bytes'] / mib:.0f} MiB, "
              f"{result['peak_bytes'] / result['count']:.0f} B/record")
    summary = {
        "rows": args.rows,
        "records": ours["count"],
        "ours_seconds": round(ours["seconds"], 3),
        "ours_peak_mib": round(ours["peak_bytes"] / mib, 1),
        "ours_bytes_per_record": round(ours["peak_bytes"] / ours["count"]),
        "baseline_seconds": round(theirs["seconds"], 3),
        "baseline_peak_mib": round(theirs["peak_bytes"] / mib, 1),
        "time_ratio": round(ours["seconds"] / theirs["seconds"], 3),
        "memory_ratio": round(ours["peak_bytes"] / theirs["peak_bytes"], 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
