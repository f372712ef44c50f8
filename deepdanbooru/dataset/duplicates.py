"""Identical and near-identical images, and which of them sit on both sides of the validation split.

Standard library, plus Pillow for the perceptual hash only: without Pillow
the near-duplicate search is unavailable and callers say so.

- Identical: the same bytes (MD5 of the file), or rows naming the same file.
- Near-identical: a 64-bit difference hash (dHash: the image in grey, area-
  resized to 9x8, one bit per horizontally adjacent pair, set when the left
  pixel is brighter) within `max_distance` differing bits. Re-encoding,
  resizing and small edits move a few bits; different pictures differ in
  about half of them.

A pair crossing the split lets the model be scored on a picture it was
trained on, so validation looks better than it is.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

DEFAULT_MAX_DISTANCE = 4
HASH_BITS = 64
def file_md5(path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pillow_available() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def dhash(path) -> int:
    """The 64-bit difference hash of an image file (Pillow); OSError or ValueError if it cannot be read."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.draft("L", (64, 64))  # JPEG: decode at a reduced scale, much faster for large pictures
            grey = image.convert("L").resize((9, 8), Image.Resampling.BOX)
            pixels = list(grey.getdata())
    except Image.DecompressionBombError as error:  # a header declaring more pixels than Pillow will decode
        raise ValueError(str(error)) from None
    value = 0
    for row in range(8):
        for column in range(8):
            value = (value << 1) | (pixels[row * 9 + column] > pixels[row * 9 + column + 1])
    return value


def near_pairs(hashes: dict[int, int], max_distance: int = DEFAULT_MAX_DISTANCE) -> set[tuple[int, int]]:
    """(a, b) keys with a < b whose hashes differ in at most `max_distance` bits.

    Split the 64 bits into max_distance + 1 blocks: two hashes that close agree
    exactly on at least one block (pigeonhole), so only keys sharing a block
    value are compared, instead of every pair.
    """
    blocks = max_distance + 1
    edges = [HASH_BITS * index // blocks for index in range(blocks + 1)]
    pairs: set[tuple[int, int]] = set()
    for low, high in zip(edges, edges[1:]):
        buckets: dict[int, list[int]] = defaultdict(list)
        mask = (1 << (high - low)) - 1
        for key, value in hashes.items():
            buckets[(value >> low) & mask].append(key)
        for members in buckets.values():
            for position, a in enumerate(members):
                for b in members[position + 1:]:
                    if (hashes[a] ^ hashes[b]).bit_count() <= max_distance:
                        pairs.add((a, b) if a < b else (b, a))
    return pairs


def identical_pairs(keys_by_content: dict) -> set[tuple[int, int]]:
    """Every pair of keys sharing a content key (an MD5)."""
    groups: dict[object, list[int]] = defaultdict(list)
    for key, content in keys_by_content.items():
        groups[content].append(key)
    return {(a, b) if a < b else (b, a)
            for members in groups.values() for i, a in enumerate(members) for b in members[i + 1:]}


def groups(keys, pairs) -> dict[int, int]:
    """key -> the smallest key of its group (pairs joined transitively)."""
    parent = {key: key for key in keys}

    def root(key):
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {key: root(key) for key in keys}


@dataclass(frozen=True)
class CrossingReport:
    identical: int  # pairs of identical images with one on each side
    near: int  # pairs of near-identical (not identical) images with one on each side
    validation_images: int  # validation images with at least one copy in training
    hashed: bool  # whether near-identical images were looked for

    @property
    def pairs(self) -> int:
        return self.identical + self.near


def crossing(identical, near, is_validation, hashed: bool) -> CrossingReport:
    """Count the pairs of `identical` and `near` (sets of (a, b) ids) whose ids fall on different sides."""
    def crossing_pairs(pairs):
        return [(a, b) for a, b in pairs if is_validation(a) != is_validation(b)]

    same = crossing_pairs(identical)
    close = crossing_pairs(set(near) - set(identical))
    leaked = {a if is_validation(a) else b for a, b in same + close}
    return CrossingReport(len(same), len(close), len(leaked), hashed)


@dataclass(frozen=True)
class GroupSummary:
    groups: int  # groups of two or more posts
    posts: int  # posts in those groups
    unread: int  # image files that could not be read (compared by their row only)
    hashed: bool  # whether near-identical pictures were looked for (Pillow present)


def group_duplicates(connection, images_dir, max_distance: int = DEFAULT_MAX_DISTANCE) -> GroupSummary:
    """Give every post of a group of identical or near-identical pictures the group's smallest id as split_id.

    scoring.split then hashes that id instead of each post's own, so a group
    lands on one side of the validation split, whatever the fraction and seed.
    Meant for a database being built: the posts of a run already started
    would change sides. The caller commits.
    """
    from deepdanbooru.dataset.records import SPLIT_COLUMN, check_md5, image_path
    from deepdanbooru.errors import UserError

    rows = connection.execute("SELECT id, md5, file_ext FROM posts WHERE typeof(id) = 'integer'").fetchall()
    hashed = pillow_available()
    content, hashes, unread = {}, {}, 0
    for row_id, md5, ext in rows:
        content[row_id] = (md5, ext)  # rows naming one file are identical even when it cannot be read
        try:
            path = image_path(images_dir, check_md5(md5, row_id, ""), ext)
            content[row_id] = file_md5(path)
            if hashed:
                hashes[row_id] = dhash(path)
        except (UserError, OSError, ValueError, SyntaxError):  # SyntaxError: Pillow on some broken files
            unread += 1
    group_of = groups([row[0] for row in rows], identical_pairs(content) | near_pairs(hashes, max_distance))
    present = {row[1] for row in connection.execute("PRAGMA table_info(posts)")}
    if SPLIT_COLUMN not in present:
        connection.execute(f"ALTER TABLE posts ADD COLUMN {SPLIT_COLUMN} INTEGER")
    moved = [(root, key) for key, root in group_of.items() if root != key]
    connection.executemany(f"UPDATE posts SET {SPLIT_COLUMN} = ? WHERE id = ?", moved)
    roots = {root for root, _ in moved}
    return GroupSummary(len(roots), len(roots) + len(moved), unread, hashed)


def describe(summary: GroupSummary, max_distance: int = DEFAULT_MAX_DISTANCE) -> str:
    what = f"identical or near-identical (dHash within {max_distance} bits)" if summary.hashed else "identical"
    line = (f"Grouped {summary.posts} posts in {summary.groups} groups of {what} pictures onto one side of the "
            "validation split (posts.split_id)")
    if not summary.hashed:
        line += "; Pillow is not installed, so near-identical pictures were not looked for"
    if summary.unread:
        line += f"; {summary.unread} image(s) could not be read and were compared by file name only"
    return line
