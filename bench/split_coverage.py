"""Which make-tags minimum and validation_fraction leave a split that can measure a small project.

    python bench/split_coverage.py DATASET_DIR [--posts 1500] [--seed 0]
                                   [--minimums 1,3,5,10,20] [--fractions 0.05,0.1,0.15,0.2]

DATASET_DIR holds dataset.sqlite (a Danbooru-style posts table, e.g. one bench/transfer_data.py wrote).
--posts draws that many posts at random (--seed) as a user's dataset; for each validation_fraction the
posts are split as train-project splits them (the post id, the project's seed 0), and for each make-tags
--minimum-post-count the tags are those that many training posts carry, as make-tags counts them. Printed
per pair: the validation posts, the tags kept, and the share of them with at least 1, 3 and 10 positives
among the validation posts (a tag without one has no AP, so no per-tag figure and no threshold of its own).
"""

from __future__ import annotations

import argparse
import collections
import random
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deepdanbooru.scoring.split import validation_mask  # noqa: E402


def coverage(posts: list[tuple[int, list[str]]], fraction: float, minimum: int, seed: int = 0) -> dict:
    """The figures of one (validation_fraction, minimum) pair over (id, tags) posts."""
    mask = validation_mask([post_id for post_id, _ in posts], fraction, seed)
    training = collections.Counter(tag for (_, tags), held in zip(posts, mask) if not held for tag in set(tags))
    validation = collections.Counter(tag for (_, tags), held in zip(posts, mask) if held for tag in set(tags))
    kept = [tag for tag, count in training.items() if count >= minimum]

    def share(least):
        return sum(validation[tag] >= least for tag in kept) / len(kept) if kept else 0.0

    return {"validation_posts": int(mask.sum()), "tags": len(kept), "with_1": share(1), "with_3": share(3),
            "with_10": share(10)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--posts", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0, help="the draw of the posts")
    parser.add_argument("--minimums", default="1,3,5,10,20")
    parser.add_argument("--fractions", default="0.05,0.1,0.15,0.2")
    args = parser.parse_args(argv)
    connection = sqlite3.connect(f"file:{args.dataset / 'dataset.sqlite'}?mode=ro", uri=True)
    rows = connection.execute("SELECT id, tag_string FROM posts ORDER BY id").fetchall()
    connection.close()
    rows = sorted(random.Random(args.seed).sample(rows, min(args.posts, len(rows))))
    posts = [(post_id, text.split()) for post_id, text in rows]
    every = collections.Counter(tag for _, tags in posts for tag in set(tags))
    print(f"{len(posts):,} posts, {len(every):,} tags, {sum(c == 1 for c in every.values()):,} of them on one post")
    print("| validation_fraction | validation posts | make-tags --minimum-post-count | tags | with >= 1 validation "
          "positive | >= 3 | >= 10 |")
    print("|---|---|---|---|---|---|---|")
    for fraction in (float(f) for f in args.fractions.split(",")):
        for minimum in (int(m) for m in args.minimums.split(",")):
            row = coverage(posts, fraction, minimum)
            print(f"| {fraction:g} | {row['validation_posts']} | {minimum} | {row['tags']:,} | {row['with_1']:.0%} | "
                  f"{row['with_3']:.0%} | {row['with_10']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
