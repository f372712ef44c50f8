"""make-training-database: our default chunk size vs DeepDanbooru's default, side by side.

Builds a Danbooru-style posts table of --rows rows once (rating, score,
is_deleted with 5% deleted), then copies it in two fresh subprocesses with
our make_training_database: once with --chunk-size 100,000 (our default) and
once with 5,000,000 (DeepDanbooru 1.0's default, i.e. the whole table in one
chunk here). Reports wall and CPU seconds (CPU is steadier on a shared
machine), posts per CPU second, tracemalloc peak and max-RSS growth, checks
both outputs hold the same rows, and prints the ratios and a JSON line.

    python bench/make_training_database.py [--rows 500000]
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
import json, resource, sys, time, tracemalloc
sys.path.insert(0, sys.argv[4])
from deepdanbooru.dataset.build import make_training_database
source, output, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
start, cpu = time.perf_counter(), time.process_time()
summary = make_training_database(source, output, chunk_size=chunk, echo=lambda line: None,
                                 progress=lambda line: None)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
peak = tracemalloc.get_traced_memory()[1]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "copied": summary.copied, "peak": peak, "rss_kib": rss}))
"""


def build_source(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    vocabulary = [f"tag_{i}" for i in range(5000)]
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER, rating TEXT, score INTEGER, is_deleted INTEGER)")

    def row(i):
        tags = rng.sample(vocabulary, rng.randint(5, 60))
        return (i, hashlib.md5(str(i).encode()).hexdigest(), rng.choice(("jpg", "png", "gif")), " ".join(tags),
                len(tags), rng.choice("gsqe"), rng.randint(-5, 100), int(rng.random() < 0.05))

    for start in range(1, rows + 1, 50_000):
        connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (row(i) for i in range(start, min(start + 50_000, rows + 1))))
    connection.commit()
    connection.close()


def run(source: Path, output: Path, chunk: int) -> dict:
    completed = subprocess.run([sys.executable, "-c", WORKER, str(source), str(output), str(chunk), str(ROOT)],
                               check=True, capture_output=True, text=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def digest(path: Path) -> str:
    connection = sqlite3.connect(path)
    hasher = hashlib.sha256()
    for row in connection.execute("SELECT id, md5, file_ext, tag_string, tag_count_general FROM posts ORDER BY id"):
        hasher.update(repr(row).encode())
    connection.close()
    return hasher.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        source = folder / "source.sqlite"
        build_source(source, args.rows)
        results = {}
        for name, chunk in (("ours_chunk_100k", 100_000), ("deepdanbooru_chunk_5m", 5_000_000)):
            output = folder / f"{name}.sqlite"
            results[name] = run(source, output, chunk)
            results[name]["digest"] = digest(output)
        assert results["ours_chunk_100k"]["digest"] == results["deepdanbooru_chunk_5m"]["digest"]
        ours, theirs = results["ours_chunk_100k"], results["deepdanbooru_chunk_5m"]
        for name, result in results.items():
            print(f"{name:24s} {result['seconds']:7.2f} s wall {result['cpu_seconds']:7.2f} s CPU  "
                  f"{result['copied'] / result['cpu_seconds']:9,.0f} posts/CPU-s  "
                  f"tracemalloc peak {result['peak'] / 2**20:7.1f} MiB  RSS growth {result['rss_kib'] / 1024:7.1f} MiB")
        ratios = {"time": ours["seconds"] / theirs["seconds"], "cpu": ours["cpu_seconds"] / theirs["cpu_seconds"],
                  "peak_memory": ours["peak"] / theirs["peak"],
                  "rss": ours["rss_kib"] / max(theirs["rss_kib"], 1)}
        print(f"ratios (ours / DeepDanbooru default): wall {ratios['time']:.2f}, CPU {ratios['cpu']:.2f}, "
              f"tracemalloc peak {ratios['peak_memory']:.3f}, RSS growth {ratios['rss']:.3f}")
        print(json.dumps({"rows": args.rows, "copied": ours["copied"],
                          "ours": {k: v for k, v in ours.items() if k != "digest"},
                          "deepdanbooru_default": {k: v for k, v in theirs.items() if k != "digest"},
                          "ratios": ratios}))


if __name__ == "__main__":
    main()
