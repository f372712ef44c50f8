"""Two Danbooru-style datasets of drawn pictures nobody on the project made: emoji, by four artists.

    # once, by hand (nothing here downloads anything): the packages npm serves
    mkdir emoji-packages && cd emoji-packages
    npm pack emojibase-data@17.0.0 emoji-datasource-apple@16.0.0 emoji-datasource-google@16.0.0 \\
             emoji-datasource-facebook@16.0.0 emoji-datasource-twitter@16.0.0
    cd .. && python bench/transfer_data.py emoji-packages transfer-data [--held-back 0.2] [--seed 0]

The pictures are the 64x64 PNGs of emoji-datasource-{apple,google,facebook,twitter} (Apple's, Noto's,
Facebook's and Twemoji's drawings of the same emoji); the tags are emojibase-data's English CLDR
keywords of each emoji (`grinning face`: cheerful, face, grin, happy, smile, teeth, ...) plus its group
and subgroup (`smileys-emotion`, `face-smiling`), normalised Danbooru-style (lower case, runs of other
characters to one underscore). A keyword that fewer than --min-emoji emoji carry is dropped: a tag of one
or two emoji is a name, not something to learn.

The emoji (not the pictures) are split at random (--seed) into two disjoint parts, so no emoji of the
fine-tuning part was seen in pretraining in any artist's drawing:

- OUT/pretrain: --pretrain-fraction of the emoji, all four drawings each; the tags it is labelled with
  leave out the held-back tags (they are never in its tag_string).
- OUT/finetune: the other emoji, all four drawings each, with every tag.
- OUT/held_back.txt: --held-back (a fraction) of the tags that at least --min-emoji emoji of the
  fine-tuning part carry, chosen at random among those the pretraining part carries too: what a
  pretrained tagger was never taught but sees drawn.

Each dataset is DIR/dataset.sqlite (table posts: id, md5, file_ext, tag_string, tag_count_general,
rating, score, is_deleted) with DIR/images/<md5[0:2]>/<md5>.png (RGB, the transparent background made
white) and DIR/tags.txt (the tags its posts carry, most frequent first). OUT/recipe.json records the
packages, options and counts.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import random
import re
import sqlite3
import sys
import tarfile
from pathlib import Path

from PIL import Image

ARTISTS = ("apple", "google", "facebook", "twitter")
KEYWORDS = "emojibase-data"
SCHEMA = ("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT NOT NULL, file_ext TEXT NOT NULL, "
          "tag_string TEXT NOT NULL, tag_count_general INTEGER NOT NULL, rating TEXT, score INTEGER, "
          "is_deleted INTEGER NOT NULL DEFAULT 0)")


class DataError(Exception):
    pass


def normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def hexkey(code: str) -> str:
    """Emoji code points without variation selector 16, which the two packages write differently."""
    return "-".join(part for part in code.upper().split("-") if part != "FE0F")


def package(folder: Path, name: str) -> Path:
    found = sorted(folder.glob(f"{name}-[0-9]*.tgz"))
    if not found:
        raise DataError(f"{folder}: no {name}-<version>.tgz (npm pack {name})")
    return found[-1]


def read_member(archive: tarfile.TarFile, name: str) -> bytes:
    try:
        return archive.extractfile(name).read()
    except KeyError:
        raise DataError(f"{archive.name}: no {name}") from None


def emoji_tags(folder: Path) -> dict[str, list[str]]:
    """hexkey -> tags (keywords, group, subgroup) from emojibase-data."""
    with tarfile.open(package(folder, KEYWORDS)) as archive:
        data = json.loads(read_member(archive, "package/en/data.json"))
        groups = json.loads(read_member(archive, "package/meta/groups.json"))
    tags = {}
    for entry in data:
        words = [normalise(word) for word in entry.get("tags", [])]
        for key, names in (("group", groups["groups"]), ("subgroup", groups["subgroups"])):
            if str(entry.get(key)) in names:
                words.append(normalise(names[str(entry[key])]))
        words = sorted({word for word in words if word})
        if words:
            tags[hexkey(entry["hexcode"])] = words
    return tags


def drawings(folder: Path, artist: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """(hexkey -> image file name, image file name -> PNG bytes) of one artist's 64 px set."""
    path = package(folder, f"emoji-datasource-{artist}")
    prefix = f"package/img/{artist}/64/"
    with tarfile.open(path) as archive:
        table = json.loads(read_member(archive, "package/emoji.json"))
        files = {}
        for member in archive:
            if member.isfile() and member.name.startswith(prefix):
                files[member.name[len(prefix):]] = archive.extractfile(member).read()
    names = {hexkey(entry["unified"]): entry["image"] for entry in table
             if entry.get(f"has_img_{artist}") and entry["image"] in files}
    return names, files


def flatten(png: bytes, size: int) -> tuple[str, bytes]:
    picture = Image.open(io.BytesIO(png)).convert("RGBA")
    if picture.size != (size, size):
        picture = picture.resize((size, size), Image.LANCZOS)
    white = Image.new("RGBA", picture.size, (255, 255, 255, 255))
    rgb = Image.alpha_composite(white, picture).convert("RGB")
    buffer = io.BytesIO()
    rgb.save(buffer, format="PNG", optimize=False)
    data = buffer.getvalue()
    return hashlib.md5(data).hexdigest(), data


def write_dataset(directory: Path, posts: list[tuple[str, bytes, list[str]]]) -> list[str]:
    """posts: (md5, png, tags). Returns tags.txt's tags."""
    directory.mkdir(parents=True, exist_ok=True)
    database = directory / "dataset.sqlite"
    if database.exists():
        database.unlink()
    counts = collections.Counter()
    rows = []
    for index, (md5, data, tags) in enumerate(posts, start=1):
        image = directory / "images" / md5[:2] / f"{md5}.png"
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(data)
        counts.update(tags)
        rows.append((index, md5, "png", " ".join(tags), len(tags), "g", 0, 0))
    connection = sqlite3.connect(database)
    with connection:
        connection.execute(SCHEMA)
        connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    connection.close()
    vocabulary = [tag for tag, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    (directory / "tags.txt").write_text("\n".join(vocabulary) + "\n")
    return vocabulary


def build(folder: Path, out: Path, size: int, seed: int, pretrain_fraction: float, held_back: float,
          min_emoji: int) -> dict:
    tags = emoji_tags(folder)
    sets = {artist: drawings(folder, artist) for artist in ARTISTS}
    # Only emoji every artist drew and emojibase tags, so both parts hold the same four styles.
    common = sorted(set(tags).intersection(*(names.keys() for names, _ in sets.values())))
    uses = collections.Counter(tag for key in common for tag in tags[key])
    kept = {tag for tag, count in uses.items() if count >= min_emoji}
    labels = {key: [tag for tag in tags[key] if tag in kept] for key in common}
    common = [key for key in common if labels[key]]
    rng = random.Random(seed)
    order = common[:]
    rng.shuffle(order)
    cut = round(len(order) * pretrain_fraction)
    parts = {"pretrain": sorted(order[:cut]), "finetune": sorted(order[cut:])}
    in_part = {name: collections.Counter(tag for key in keys for tag in labels[key]) for name, keys in parts.items()}
    eligible = sorted(tag for tag, count in in_part["finetune"].items()
                      if count >= min_emoji and in_part["pretrain"][tag] > 0)
    withheld = sorted(rng.sample(eligible, round(len(eligible) * held_back)))
    report = {"packages": sorted(p.name for p in folder.glob("*.tgz")), "size": size, "seed": seed,
              "pretrain_fraction": pretrain_fraction, "min_emoji": min_emoji, "held_back": withheld,
              "emoji": {name: len(keys) for name, keys in parts.items()}}
    for name, keys in parts.items():
        posts, seen = [], set()
        for key in keys:
            tag_list = [tag for tag in labels[key] if name != "pretrain" or tag not in withheld]
            if not tag_list:
                continue
            for artist in ARTISTS:
                names, files = sets[artist]
                md5, data = flatten(files[names[key]], size)
                if md5 in seen:  # two artists' identical drawings would be one post twice
                    continue
                seen.add(md5)
                posts.append((md5, data, tag_list))
        vocabulary = write_dataset(out / name, posts)
        report[name] = {"posts": len(posts), "tags": len(vocabulary)}
    (out / "held_back.txt").write_text("\n".join(withheld) + "\n")
    (out / "recipe.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", type=Path, help="folder of the npm pack .tgz files")
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrain-fraction", type=float, default=0.6)
    parser.add_argument("--held-back", type=float, default=0.2, help="fraction of the eligible tags")
    parser.add_argument("--min-emoji", type=int, default=5, help="fewest emoji a tag must label")
    args = parser.parse_args(argv)
    try:
        report = build(args.packages, args.out, args.size, args.seed, args.pretrain_fraction, args.held_back,
                       args.min_emoji)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps({key: value for key, value in report.items() if key != "held_back"}, indent=2))
    print(f"held back from pretraining: {len(report['held_back'])} tags ({args.out / 'held_back.txt'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
