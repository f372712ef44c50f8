"""Captions as a user gets them, against the pictures' known tags: the default thresholds beside a fixed one.

    python bench/caption_f1.py PROJECT --database DATASET.sqlite --ids HELD_OUT_IDS.txt [--threshold 0.5]
        [--model-path FILE] [--work DIR]

Runs `deepdanbooru evaluate FOLDER --project-path PROJECT --allow-folder --format json` twice in one go on the
held-out posts' pictures (ids one a line, none of them in the project's database): once with the default
thresholds (what `evaluate` and `--save-txt` use without options) and once with `--threshold T` for every
tag. Prints, for each road: the mean per-picture F1 (a picture's tags in the model's vocabulary against the
tags printed; 2|both| / (|known| + |printed|), 1 for a picture with neither), micro precision and recall, tags
printed per picture, and the tags printed on more than half of the pictures with the share of pictures that
carry them. The pictures are linked, not copied, into --work (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def held_out(database: Path, ids_file: Path, folder: Path) -> dict[str, set[str]]:
    ids = [int(line) for line in ids_file.read_text().split()]
    connection = sqlite3.connect(database)
    truth = {}
    for post_id in ids:
        row = connection.execute("SELECT md5, file_ext, tag_string FROM posts WHERE id = ?", (post_id,)).fetchone()
        if row is None:
            sys.exit(f"{database}: no post {post_id}")
        md5, ext, tag_string = row
        name = f"{post_id:06d}.{ext}"
        link = folder / name
        if not link.exists():
            os.symlink(database.parent / "images" / md5[:2] / f"{md5}.{ext}", link)
        truth[name] = set(tag_string.split())
    return truth


def caption(project: Path, folder: Path, options: list[str]) -> tuple[dict[str, set[str]], float]:
    command = [sys.executable, "-m", "deepdanbooru", "evaluate", str(folder), "--project-path", str(project),
               "--allow-folder", "--format", "json", *options]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    first = done.stderr.splitlines()[0] if done.stderr else ""
    print(f"  {' '.join(options) or '(defaults)'}: {first}")
    printed = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        printed[Path(record["path"]).name] = set(record["tags"])
    return printed, seconds


def figures(truth: dict, printed: dict, vocabulary: set[str]) -> dict:
    f1s, tp, fp, fn, landed = [], 0, 0, 0, {}
    for name, tags in truth.items():
        known = tags & vocabulary
        got = printed.get(name, set())
        both = len(known & got)
        f1s.append(1.0 if not known and not got else 2 * both / (len(known) + len(got)))
        tp, fp, fn = tp + both, fp + len(got - known), fn + len(known - got)
        for tag in got:
            landed[tag] = landed.get(tag, 0) + 1
    pictures = len(truth)
    carried = {tag: sum(tag in tags for tags in truth.values()) for tag in landed}
    over_half = sorted(((count, tag) for tag, count in landed.items() if count > pictures / 2), reverse=True)
    return {
        "pictures": pictures,
        "mean_picture_f1": sum(f1s) / pictures,
        "micro_precision": tp / (tp + fp) if tp + fp else 0.0,
        "micro_recall": tp / (tp + fn) if tp + fn else 0.0,
        "tags_per_picture": (tp + fp) / pictures,
        "over_half": [(tag, count / pictures, carried[tag] / pictures) for count, tag in over_half],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path)
    parser.add_argument("--database", type=Path, required=True, help="dataset.sqlite holding the held-out posts")
    parser.add_argument("--ids", type=Path, required=True, help="the held-out post ids, one a line")
    parser.add_argument("--threshold", type=float, default=0.5, help="the fixed threshold to compare with")
    parser.add_argument("--model-path", type=Path, help="another model than the project's")
    parser.add_argument("--work", type=Path, help="where to link the pictures (default: a temporary folder)")
    args = parser.parse_args()
    vocabulary = set((args.project / "tags.txt").read_text(encoding="utf-8").split())
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.work or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        truth = held_out(args.database.resolve(), args.ids, folder)
        extra = ["--model-path", str(args.model_path)] if args.model_path else []
        print(f"{len(truth)} held-out pictures; {len(vocabulary)} tags in the model's vocabulary")
        roads = {"default thresholds": extra, f"fixed {args.threshold:g}": [*extra, "--threshold",
                                                                          str(args.threshold)]}
        results = {}
        for label, options in roads.items():
            printed, seconds = caption(args.project, folder, options)
            results[label] = (figures(truth, printed, vocabulary), seconds)
    for label, (result, seconds) in results.items():
        over = ", ".join(f"{tag} on {share:.0%} (carried by {carried:.0%})" for tag, share, carried in
                         result["over_half"]) or "none"
        print(f"{label}: mean per-picture F1 {result['mean_picture_f1']:.4f}, micro precision "
              f"{result['micro_precision']:.4f}, recall {result['micro_recall']:.4f}, "
              f"{result['tags_per_picture']:.2f} tags a picture ({seconds:.1f} s); on over half the pictures: {over}")
    (default, _), (fixed, _) = results.values()
    print(f"ratio of mean per-picture F1, default / fixed: {default['mean_picture_f1'] / fixed['mean_picture_f1']:.3f}")


if __name__ == "__main__":
    main()
