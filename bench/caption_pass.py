"""What import-images' separator check costs on tar shards: the first pass over a shard's captions (pictures'
bytes passed over) that a --caption-separator other than the default brings, side by side with imports that
have none, in one run.

Draws --pictures 512x512 JPEGs with bench/datasets.py's maker, writes them as one shard with .txt captions joined
by ", ", one with the same captions joined by " | " and one with .json post objects (no captions), and runs
`deepdanbooru import-images` on each in a fresh process pinned to one core:

- ", " captions, no --caption-separator: no first pass (the reference);
- " | " captions with --caption-separator " | ": the first pass ends at the first caption (it holds the mark);
- " | " captions with --caption-separator ";": no caption holds it; refused after the first pass, nothing
  written (a check after the import would cost the whole import, then taking back what it placed);
- .json post objects with and without --caption-separator " | ": no caption to end the first pass, so it reads
  the whole shard (the worst case);
- the folder road on the same pictures with ", " captions (no first pass), " | " captions with " | " and with ";".

    python bench/caption_pass.py --pictures 10000 --work /tmp/caption-pass [--gzip]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_datasets", ROOT / "bench" / "datasets.py")
bench_datasets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_datasets)


def measure(arguments: list[str], log: Path, exit_code: int = 0) -> dict:
    """Wall and CPU seconds of one deepdanbooru command in a fresh process on one core, and its exit code."""
    peak = log.with_suffix(".peak")
    with open(log, "w") as stream:
        start = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-c", bench_datasets.WRAPPER, str(peak), *arguments],
                                   stdout=stream, stderr=subprocess.STDOUT, preexec_fn=bench_datasets.pinned,
                                   cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != exit_code:
        raise SystemExit(f"{' '.join(arguments)} exited {code}, not {exit_code}; see {log}:\n"
                         f"{log.read_text()[-2000:]}")
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime}


def caption_shard(loose: Path, target: Path, separator: str, compress: bool) -> Path:
    """The loose pictures and their captions (re-joined by `separator`) as one shard."""
    with tarfile.open(target, "w:gz" if compress else "w") as archive:
        for picture in sorted(loose.glob("*.jpg")):
            tags = picture.with_suffix(".txt").read_text().strip().split(", ")
            for name, data in ((picture.name, picture.read_bytes()), (f"{picture.stem}.txt",
                                                                      separator.join(tags).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pictures", type=int, default=10_000)
    parser.add_argument("--work", type=Path, required=True, help="a folder for the generated files (removed after)")
    parser.add_argument("--gzip", action="store_true", help="gzipped shards (.tar.gz) instead of plain .tar")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    folder = args.work / "caption-pass"
    shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()
    print(f"load average at the start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores",
          flush=True)
    try:
        shards, loose, mean_bytes = bench_datasets.write_pictures(folder, args.pictures, per_shard=args.pictures)
        suffix = ".tar.gz" if args.gzip else ".tar"
        posts = shards[0]
        if args.gzip:
            posts = folder / f"posts{suffix}"
            with tarfile.open(shards[0]) as plain, tarfile.open(posts, "w:gz") as packed:
                for member in plain:
                    packed.addfile(member, plain.extractfile(member))
        comma = caption_shard(loose, folder / f"comma{suffix}", ", ", args.gzip)
        bar = caption_shard(loose, folder / f"bar{suffix}", " | ", args.gzip)
        sizes = ", ".join(f"{shard.stat().st_size / 2**20:,.0f}" for shard in (comma, bar, posts))
        print(f"wrote {args.pictures:,} JPEGs (mean {mean_bytes / 1024:.1f} KiB) as three {suffix} shards of "
              f"{sizes} MiB", flush=True)
        bar_loose = folder / "bar-loose"  # the folder road: the same pictures (hard links) with " | " captions
        bar_loose.mkdir()
        for picture in sorted(loose.glob("*.jpg")):
            os.link(picture, bar_loose / picture.name)
            tags = picture.with_suffix(".txt").read_text().strip().split(", ")
            (bar_loose / f"{picture.stem}.txt").write_text(" | ".join(tags) + "\n")
        bar_option = ["--caption-separator", " | "]
        runs = [('", " captions, no --caption-separator (no first pass)', [comma], 0),
                ('" | " captions, --caption-separator " | " (first pass ends at caption 1)', [bar, *bar_option], 0),
                ('" | " captions, --caption-separator ";" (refused after the first pass)',
                 [bar, "--caption-separator", ";"], 2),
                (".json post objects, no --caption-separator", [posts], 0),
                ('.json post objects, --caption-separator " | " (first pass reads the shard)', [posts, *bar_option],
                 0),
                ('folder, ", " captions, no --caption-separator (no first pass)', [loose], 0),
                ('folder, " | " captions, --caption-separator " | " (first pass ends at caption 1)',
                 [bar_loose, *bar_option], 0),
                ('folder, " | " captions, --caption-separator ";" (refused after the first pass)',
                 [bar_loose, "--caption-separator", ";"], 2)]
        results = []
        for index, (name, arguments, code) in enumerate(runs):
            dataset = folder / f"dataset-{index}"
            result = measure(["import-images", *map(str, arguments[:1]), str(dataset), *arguments[1:]],
                             folder / f"import-{index}.log", code)
            result["digest"] = bench_datasets.digest(dataset / "dataset.sqlite") if code == 0 else None
            if code:
                assert not dataset.exists(), "a refused import wrote its dataset"
            results.append((name, result))
            print(name, {k: round(v, 2) for k, v in result.items() if k != "digest"}, flush=True)
        digests = {result["digest"] for index, (_, result) in enumerate(results) if runs[index][2] == 0}
        assert len(digests) == 1, "the datasets differ"
        print(f"\nimport-images, one {suffix} shard (or a folder) of {args.pictures:,} pictures, one core")
        print("| shard and option | wall s | CPU s | wall / its reference | CPU / its reference |")
        print("|---|---|---|---|---|")
        for index, (name, result) in enumerate(results):
            reference = results[5 if index >= 5 else 3 if index >= 3 else 0][1]
            shown = name.replace("|", "\\|")  # a pipe inside a Markdown table cell
            print(f"| {shown} | {result['seconds']:.1f} | {result['cpu_seconds']:.1f} | "
                  f"{result['seconds'] / reference['seconds']:.2f} | "
                  f"{result['cpu_seconds'] / reference['cpu_seconds']:.2f} |")
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
