"""The small-data case of the transfer measurement: the fine-tuning part cut to COUNT training posts.

    python bench/transfer_small.py transfer-work/data/finetune transfer-work/data/small_s0 [--count 1000] [--seed 0]

Keeps every post the bench's split (validation_fraction 0.1 and this --seed, as bench/quality.py's
projects use with "seed" set to it) puts in validation, so the small case is scored on the same posts as
the full one, and COUNT training posts drawn at random with --seed. The pictures are not copied: OUT/images
links to the source's.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deepdanbooru.scoring.split import validation_mask  # noqa: E402

VALIDATION_FRACTION = 0.1  # bench/quality.py's BASE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a dataset folder: dataset.sqlite, images/, tags.txt")
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=1000, help="training posts to keep")
    parser.add_argument("--seed", type=int, default=0, help="the projects' seed (the split) and the draw's")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.source / "dataset.sqlite", args.out / "dataset.sqlite")
    shutil.copy(args.source / "tags.txt", args.out / "tags.txt")
    if not (args.out / "images").exists():
        os.symlink((args.source / "images").resolve(), args.out / "images")
    connection = sqlite3.connect(args.out / "dataset.sqlite")
    ids = np.array([row[0] for row in connection.execute("SELECT id FROM posts ORDER BY id")], dtype=np.int64)
    validation = validation_mask(ids, VALIDATION_FRACTION, args.seed)
    training = ids[~validation].tolist()
    random.Random(args.seed).shuffle(training)
    keep = set(ids[validation].tolist()) | set(training[:args.count])
    connection.execute("CREATE TEMP TABLE keep (id INTEGER PRIMARY KEY)")
    connection.executemany("INSERT INTO keep VALUES (?)", [(int(i),) for i in keep])
    connection.execute("DELETE FROM posts WHERE id NOT IN (SELECT id FROM keep)")
    connection.commit()
    connection.execute("VACUUM")
    connection.close()
    print(f"{args.out}: {int(validation.sum())} validation posts, {min(args.count, len(training))} training posts")


if __name__ == "__main__":
    main()
