"""Danbooru datasets as people have them: make-training-database from SQLite, gzipped JSON Lines and Parquet,
and import-images from tar shards against a folder of loose pictures, side by side in one run.

Part 1 writes --posts Danbooru API post objects (46 fields each, 5-60 general tags from 5,000, a few
character/copyright/meta tags, one artist; 5% deleted) once as a SQLite posts table, a gzipped JSON Lines file
and two Parquet files (pyarrow's default writer: one row group up to 1,048,576 rows; and row groups of 100,000
rows), then runs `deepdanbooru make-training-database SOURCE OUTPUT` on each in a fresh process pinned to one
core. Reported: wall and CPU seconds, posts per second and the peak resident memory of the process (max RSS),
with the ratio to the SQLite source; the outputs are checked to hold identical posts.

Part 2 draws --pictures 512x512 JPEGs with the repo's sample generator (a picture drawn per 8, each shown in the 8
flips and quarter turns, so every file differs), writes them as tar shards of 1,000 samples (picture + .json post
object) and as a folder of loose pictures with .txt captions holding the same tags, and runs `deepdanbooru
import-images` on each in a fresh process pinned to one core: pictures per second (wall and CPU) and the ratio;
the two datasets are checked to hold identical posts.

    python bench/datasets.py --posts 1000000 --pictures 10000 --work /tmp/datasets-bench [--keep]
    python bench/datasets.py --parts posts --reuse-posts KEPT/posts --work /tmp/datasets-bench
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHUNK = 100_000
RATINGS = "gsqe"


def post_objects(count: int, seed: int = 0):
    """Danbooru API post objects (the fields /posts.json returns, less the nested media_asset)."""
    rng = random.Random(seed)
    general = [f"general_tag_{i}" for i in range(5000)]
    character = [f"character_{i}_(series)" for i in range(2000)]
    copyright_ = [f"series_{i}" for i in range(500)]
    meta = ["highres", "absurdres", "commentary_request", "translated", "bad_id", "bad_pixiv_id"]
    for i in range(1, count + 1):
        tags = {"general": sorted(rng.sample(general, rng.randint(5, 60))),
                "character": rng.sample(character, rng.randint(0, 2)),
                "copyright": rng.sample(copyright_, rng.randint(0, 2)),
                "artist": [f"artist_{rng.randrange(20000)}"], "meta": rng.sample(meta, rng.randint(0, 3))}
        md5 = hashlib.md5(i.to_bytes(8, "little")).hexdigest()
        ext = rng.choice(("jpg", "jpg", "jpg", "png", "gif", "mp4"))
        day = f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
        stamp = f"{day}T0{rng.randint(0, 9)}:12:34.567-05:00"
        width, height, up = rng.randint(300, 4000), rng.randint(300, 4000), rng.randint(0, 300)
        yield {
            "id": i, "created_at": stamp, "uploader_id": rng.randint(1, 900000), "score": up,
            "source": f"https://www.pixiv.net/artworks/{rng.randint(10**7, 10**8)}", "md5": md5,
            "last_comment_bumped_at": None, "rating": rng.choice(RATINGS), "image_width": width,
            "image_height": height, "tag_string": " ".join(sorted(t for part in tags.values() for t in part)),
            "fav_count": up, "file_ext": ext, "last_noted_at": None, "parent_id": None, "has_children": False,
            "approver_id": None, "tag_count_general": len(tags["general"]),
            "tag_count_artist": len(tags["artist"]), "tag_count_character": len(tags["character"]),
            "tag_count_copyright": len(tags["copyright"]), "file_size": rng.randint(10**5, 10**7),
            "up_score": up, "down_score": 0, "is_pending": False, "is_flagged": False,
            "is_deleted": rng.random() < 0.05, "tag_count": sum(len(part) for part in tags.values()),
            "updated_at": stamp, "is_banned": False, "pixiv_id": rng.randint(10**7, 10**8),
            "last_commented_at": None, "has_active_children": False, "bit_flags": 0,
            "tag_count_meta": len(tags["meta"]), "has_large": True, "has_visible_children": False,
            **{f"tag_string_{name}": " ".join(part) for name, part in tags.items()},
            "file_url": f"https://cdn.donmai.us/original/{md5[:2]}/{md5[2:4]}/{md5}.{ext}",
            "large_file_url": f"https://cdn.donmai.us/sample/{md5[:2]}/{md5[2:4]}/sample-{md5}.jpg",
            "preview_file_url": f"https://cdn.donmai.us/180x180/{md5[:2]}/{md5[2:4]}/{md5}.jpg",
        }


def source_names(folder: Path) -> dict[str, Path]:
    return {"SQLite": folder / "posts.sqlite", "JSON Lines (gzip)": folder / "posts.jsonl.gz",
            "Parquet (row groups of 100k)": folder / "posts-100k.parquet",
            "Parquet (1 row group, pyarrow default)": folder / "posts.parquet"}


def write_sources(folder: Path, count: int) -> dict[str, Path]:
    import pyarrow
    import pyarrow.parquet as parquet

    paths = source_names(folder)
    connection = sqlite3.connect(paths["SQLite"])
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER, rating TEXT, score INTEGER, is_deleted INTEGER)")
    writer, schema, batch = None, None, []
    with gzip.open(paths["JSON Lines (gzip)"], "wt", encoding="utf-8") as lines:
        for post in post_objects(count):
            lines.write(json.dumps(post, separators=(",", ":")) + "\n")
            batch.append(post)
            if len(batch) == CHUNK or post["id"] == count:
                connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
                    (p["id"], p["md5"], p["file_ext"], p["tag_string"], p["tag_count_general"], p["rating"],
                     p["score"], int(p["is_deleted"])) for p in batch])
                table = pyarrow.Table.from_pylist(batch, schema=schema)
                if writer is None:
                    schema = table.schema
                    writer = parquet.ParquetWriter(paths["Parquet (row groups of 100k)"], schema)
                writer.write_table(table)
                batch = []
    writer.close()
    connection.commit()
    connection.close()
    # pandas' and pyarrow's write_table put up to 1,048,576 rows in one row group.
    parquet.write_table(parquet.read_table(paths["Parquet (row groups of 100k)"]),
                        paths["Parquet (1 row group, pyarrow default)"])
    return paths


def pinned():
    """Run the child on one core, as the measurements are quoted (pictures a second, one core)."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


# The command line in-process; at exit it writes its peak RSS (VmHWM: the high-water mark of this program's own
# memory; getrusage's maxrss would include the bench process it was forked from).
WRAPPER = """
import atexit, sys
peak_file = sys.argv[1]
def peak():
    with open('/proc/self/status') as status, open(peak_file, 'w') as out:
        out.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(peak)
sys.argv = ['deepdanbooru', *sys.argv[2:]]
from deepdanbooru.cli import run
run()
"""


def measure(arguments: list[str], log: Path) -> dict:
    """Wall and CPU seconds and the peak RSS of one deepdanbooru command in a fresh process on one core."""
    peak = log.with_suffix(".peak")
    with open(log, "w") as stream:
        start = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-c", WRAPPER, str(peak), *arguments], stdout=stream,
                                   stderr=subprocess.STDOUT, preexec_fn=pinned, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(arguments)} failed; see {log}:\n{log.read_text()[-2000:]}")
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": int(peak.read_text()) / 1024}


def digest(database: Path) -> str:
    connection = sqlite3.connect(database)
    hasher = hashlib.sha256()
    for row in connection.execute("SELECT id, md5, file_ext, tag_string, tag_count_general, rating, score, "
                                  "is_deleted FROM posts ORDER BY id"):
        hasher.update(repr(row).encode())
    connection.close()
    return hasher.hexdigest()


def part_posts(work: Path, count: int, reuse: Path | None = None) -> dict:
    folder = work / "posts"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    start = time.perf_counter()
    if reuse is None:
        sources = write_sources(folder, count)
    else:  # the sources an earlier run kept (--keep), hard-linked: writing them takes minutes
        sources = {name: folder / path.name for name, path in source_names(reuse).items()}
        for name, path in source_names(reuse).items():
            os.link(path, sources[name])
    print(f"{'wrote' if reuse is None else 'reused'} the {count:,} posts in 4 forms in "
          f"{time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{path.name} {path.stat().st_size / 2**20:,.0f} MiB" for path in sources.values()), flush=True)
    baseline = measure(["--version"], folder / "version.log")
    results = {}
    for name, source in sources.items():
        output = folder / f"out-{source.name}.sqlite"
        results[name] = measure(["make-training-database", str(source), str(output)], folder / f"{source.name}.log")
        results[name]["digest"] = digest(output)
        results[name]["copied"] = sqlite3.connect(output).execute("SELECT COUNT(*) FROM posts").fetchone()[0]
        output.unlink()
        print(name, json.dumps(results[name]), flush=True)
    assert len({result["digest"] for result in results.values()}) == 1, "the outputs differ"
    reference = results["SQLite"]
    print(f"\nmake-training-database, {count:,} posts ({reference['copied']:,} copied), one core; "
          f"a bare `deepdanbooru --version` peaks at {baseline['peak_rss_mib']:.0f} MiB")
    print("| source | file MiB | wall s | CPU s | posts/s (wall) | peak RSS MiB | wall / SQLite | peak RSS / SQLite |")
    print("|---|---|---|---|---|---|---|---|")
    for name, result in results.items():
        print(f"| {name} | {sources[name].stat().st_size / 2**20:,.0f} | {result['seconds']:.1f} | "
              f"{result['cpu_seconds']:.1f} | {count / result['seconds']:,.0f} | {result['peak_rss_mib']:,.0f} | "
              f"{result['seconds'] / reference['seconds']:.2f} | "
              f"{result['peak_rss_mib'] / reference['peak_rss_mib']:.2f} |")
    return {name: {k: v for k, v in result.items() if k != "digest"} for name, result in results.items()}


def write_pictures(folder: Path, count: int, per_shard: int = 1000) -> tuple[list[Path], Path, float]:
    """Tar shards (picture + .json post object) and a folder of the same pictures with .txt captions."""
    import numpy as np
    from PIL import Image

    from deepdanbooru.sample.generator import draw_picture

    shards_dir, loose = folder / "shards", folder / "loose"
    shards_dir.mkdir(parents=True)
    loose.mkdir()
    turns = [None, Image.Transpose.FLIP_LEFT_RIGHT, Image.Transpose.FLIP_TOP_BOTTOM, Image.Transpose.ROTATE_90,
             Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270, Image.Transpose.TRANSPOSE,
             Image.Transpose.TRANSVERSE]
    shards, archive, total_bytes, index = [], None, 0, 0
    rng = np.random.default_rng(0)
    while index < count:
        drawn, tags = draw_picture(rng, 512)
        for turn in turns:
            if index == count:
                break
            if index % per_shard == 0:
                if archive is not None:
                    archive.close()
                shards.append(shards_dir / f"{index // per_shard:05d}.tar")
                archive = tarfile.open(shards[-1], "w")
            image = drawn if turn is None else drawn.transpose(turn)
            stream = io.BytesIO()
            image.save(stream, "JPEG", quality=90)
            data = stream.getvalue()
            total_bytes += len(data)
            rating = RATINGS[index % 4]
            tag_string = " ".join(tags)
            post = {"id": index + 1, "md5": hashlib.md5(data).hexdigest(), "file_ext": "jpg", "rating": rating,
                    "tag_string": tag_string, "tag_string_general": tag_string, "tag_count_general": len(tags),
                    "is_deleted": False}
            key = f"{index:08d}"
            for name, member in ((f"{key}.jpg", data), (f"{key}.json", json.dumps(post).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(member)
                archive.addfile(info, io.BytesIO(member))
            (loose / f"{key}.jpg").write_bytes(data)
            rating_tag = {"g": "general", "s": "sensitive", "q": "questionable", "e": "explicit"}[rating]
            (loose / f"{key}.txt").write_text(", ".join([*tags, f"rating:{rating_tag}"]) + "\n")
            index += 1
    archive.close()
    return shards, loose, total_bytes / count


def part_pictures(work: Path, count: int) -> dict:
    folder = work / "pictures"
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    shards, loose, mean_bytes = write_pictures(folder, count)
    print(f"\nwrote {count:,} 512x512 JPEGs (mean {mean_bytes / 1024:.1f} KiB) as {len(shards)} shards and as loose "
          f"files in {time.perf_counter() - start:.0f} s", flush=True)
    results = {}
    for name, source in (("tar shards (.jpg + .json)", [str(folder / "shards")]),
                         ("folder of loose files (.jpg + .txt)", [str(loose)])):
        dataset = folder / f"dataset-{len(results)}"
        results[name] = measure(["import-images", *source, str(dataset)], folder / f"import-{len(results)}.log")
        results[name]["digest"] = digest(dataset / "dataset.sqlite")
        print(name, json.dumps(results[name]), flush=True)
    assert len({result["digest"] for result in results.values()}) == 1, "the datasets differ"
    reference = results["folder of loose files (.jpg + .txt)"]
    print(f"\nimport-images, {count:,} pictures, one core")
    print("| source | wall s | CPU s | pictures/s (wall) | pictures/CPU-s | peak RSS MiB | wall / folder |")
    print("|---|---|---|---|---|---|---|")
    for name, result in results.items():
        print(f"| {name} | {result['seconds']:.1f} | {result['cpu_seconds']:.1f} | {count / result['seconds']:,.0f} | "
              f"{count / result['cpu_seconds']:,.0f} | {result['peak_rss_mib']:,.0f} | "
              f"{result['seconds'] / reference['seconds']:.2f} |")
    return {name: {k: v for k, v in result.items() if k != "digest"} for name, result in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=1_000_000)
    parser.add_argument("--pictures", type=int, default=10_000)
    parser.add_argument("--work", type=Path, required=True, help="a folder for the generated files (removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--reuse-posts", type=Path, help="a folder holding the posts.* sources of an earlier run "
                                                         "with the same --posts (kept with --keep)")
    parser.add_argument("--parts", default="posts,pictures", help="posts, pictures or both (comma-separated)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores",
          flush=True)
    summary = {"posts": args.posts, "pictures": args.pictures, "load_start": load}
    try:
        if "posts" in args.parts:
            summary["make_training_database"] = part_posts(args.work, args.posts, args.reuse_posts)
        if "pictures" in args.parts:
            summary["import_images"] = part_pictures(args.work, args.pictures)
    finally:
        if not args.keep:
            shutil.rmtree(args.work / "posts", ignore_errors=True)
            shutil.rmtree(args.work / "pictures", ignore_errors=True)
    summary["load_end"] = os.getloadavg()
    print(f"load average at the end: {summary['load_end'][0]:.1f} {summary['load_end'][1]:.1f} "
          f"{summary['load_end'][2]:.1f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
