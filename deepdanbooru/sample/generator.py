"""A deterministic synthetic dataset in the DeepDanbooru layout.

Every tag is a fact about the pixels that survives the training augmentation
(rotation, scale, shift with replicated borders): the background colour, the
kind, colour, size and number of the shapes. Shapes are kept inside the disc
that no rotation or shift can push out of the frame, so a count is never
changed by cropping.

Image i depends only on (seed, i), so a smaller dataset is a prefix of a
larger one with the same seed.

This module draws the basic preset; PRESETS names the others (sample/hard.py).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import math
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from deepdanbooru.errors import DatasetError, file_field
from deepdanbooru.fileio import write_text_atomic
from deepdanbooru.formats import IMAGE_FORMATS

DATABASE_NAME = "dataset.sqlite"
TAGS_NAME = "tags.txt"
RECIPE_NAME = "sample.json"
# Bump when the pictures change, so an old dataset is not mistaken for the current one.
RECIPE_VERSION = 1

# name -> RGB; jittered a little per image so the model learns a colour, not a value.
BACKGROUNDS = {
    "white_background": (245, 245, 245),
    "black_background": (15, 15, 15),
    "grey_background": (128, 128, 128),
}
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 180, 50),
    "blue": (40, 60, 230),
    "yellow": (235, 215, 20),
}
SHAPES = ("circle", "square", "triangle", "star")
COUNTS = ("one_shape", "two_shapes", "three_shapes")
# Circumradius as a fraction of the image side: large is about twice small,
# far more than the 0.9-1.1 scale augmentation can blur.
SIZES = {"large": 0.16, "small": 0.085}
MULTICOLORED = "multicolored"

TAGS: tuple[str, ...] = (
    *BACKGROUNDS, *SHAPES, *COLOURS, *COUNTS, *SIZES, MULTICOLORED,
)

# With rotation about the centre and shifts of up to 10% of the side, only a
# disc of radius 0.5 - 0.1 of the side is certain to stay in the frame.
SAFE_RADIUS = 0.4
GAP = 0.03  # between shapes, so two shapes never merge into one blob

# The file_ext written to the database -> Pillow's format name; save options where Pillow's defaults lose detail.
FORMATS = {f.extension: f.pillow[0] for f in IMAGE_FORMATS}
SAVE_OPTIONS = {"jpg": {"quality": 95, "subsampling": 0}, "webp": {"quality": 90, "method": 4}}

SUPERSAMPLE = 4  # drawn large then box-filtered: anti-aliased edges, still deterministic
RATINGS = ("g", "s", "q", "e")
RATING_WEIGHTS = (0.55, 0.25, 0.12, 0.08)
DELETED_FRACTION = 0.05


@dataclass(frozen=True)
class Post:
    id: int
    md5: str
    file_ext: str
    tags: tuple[str, ...]
    rating: str
    score: int
    is_deleted: int

    @property
    def tag_string(self) -> str:
        return " ".join(self.tags)


def _jitter(rng: np.random.Generator, rgb, amount: int) -> tuple[int, int, int]:
    return tuple(int(np.clip(c + rng.integers(-amount, amount + 1), 0, 255)) for c in rgb)


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        vertices = [(r, a) for a in (0, 90, 180, 270)]
    elif kind == "triangle":
        vertices = [(r, a) for a in (0, 120, 240)]
    else:  # star: five points, inner radius 0.45 r
        vertices = [(r if k % 2 == 0 else 0.45 * r, 36 * k) for k in range(10)]
    return [
        (cx + radius * math.cos(math.radians(a) + angle), cy + radius * math.sin(math.radians(a) + angle))
        for radius, a in vertices
    ]


def _place(rng: np.random.Generator, count: int, radius: float) -> list[tuple[float, float]] | None:
    """Centres (in units of the side, origin at the middle) of non-overlapping shapes inside the safe disc."""
    reach = SAFE_RADIUS - radius
    centres: list[tuple[float, float]] = []
    for _ in range(500):
        # uniform in the disc
        rho = reach * math.sqrt(rng.random())
        theta = 2 * math.pi * rng.random()
        x, y = rho * math.cos(theta), rho * math.sin(theta)
        if all(math.hypot(x - u, y - v) >= 2 * radius + GAP for u, v in centres):
            centres.append((x, y))
            if len(centres) == count:
                return centres
    return None


def draw_picture(rng: np.random.Generator, size: int) -> tuple[Image.Image, tuple[str, ...]]:
    """One RGB picture and its tags, in TAGS order."""
    background = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    kind = SHAPES[rng.integers(len(SHAPES))]
    count = 1 + int(rng.integers(len(COUNTS)))
    size_tag = list(SIZES)[rng.integers(len(SIZES))]
    colour_names = list(COLOURS)
    if count > 1 and rng.random() < 0.5:
        colours = [colour_names[rng.integers(len(colour_names))] for _ in range(count)]
    else:
        colours = [colour_names[rng.integers(len(colour_names))]] * count
    radius = SIZES[size_tag]
    centres = None
    while centres is None:
        centres = _place(rng, count, radius)

    side = size * SUPERSAMPLE
    canvas = Image.new("RGB", (side, side), _jitter(rng, BACKGROUNDS[background], 8))
    pen = ImageDraw.Draw(canvas)
    for (x, y), colour in zip(centres, colours):
        fill = _jitter(rng, COLOURS[colour], 15)
        cx, cy, r = (0.5 + x) * side, (0.5 + y) * side, radius * side
        if kind == "circle":
            pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
        else:
            pen.polygon(_polygon(kind, cx, cy, r, 2 * math.pi * rng.random()), fill=fill)
    picture = canvas.resize((size, size), Image.Resampling.BOX)

    present = {background, kind, COUNTS[count - 1], size_tag, *colours}
    if len(set(colours)) > 1:
        present.add(MULTICOLORED)
    return picture, tuple(tag for tag in TAGS if tag in present)


def encode(picture: Image.Image, image_format: str) -> bytes:
    pillow_format, options = FORMATS[image_format], SAVE_OPTIONS.get(image_format, {})
    if image_format == "gif":
        # A fixed adaptive palette keeps GIF output deterministic and close to the RGB picture.
        picture = picture.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    picture.save(buffer, format=pillow_format, **options)
    return buffer.getvalue()


# preset -> (module with draw_picture and TAGS, version written to the recipe; None for basic,
# whose recipe predates presets and must keep matching datasets made before them).
# Bump a version when its pictures change, so an old dataset is not mistaken for the current one.
PRESETS = {
    "basic": ("deepdanbooru.sample.generator", None),
    "hard": ("deepdanbooru.sample.hard", 1),
}


def preset_module(preset: str):
    if preset not in PRESETS:
        raise DatasetError(f"preset {preset!r} is not one of {', '.join(PRESETS)}")
    return importlib.import_module(PRESETS[preset][0])


def make_post(seed: int, index: int, size: int, image_format: str, taken: set[str],
              draw=draw_picture) -> tuple[Post, bytes]:
    """Post index (id index + 1) and its encoded image; redraws on the rare identical picture."""
    rng = np.random.default_rng([seed, index])
    while True:
        picture, tags = draw(rng, size)
        data = encode(picture, image_format)
        md5 = hashlib.md5(data).hexdigest()
        if md5 not in taken:
            break
    taken.add(md5)
    rating = RATINGS[int(rng.choice(len(RATINGS), p=RATING_WEIGHTS))]
    post = Post(
        id=index + 1,
        md5=md5,
        file_ext=image_format,
        tags=tags,
        rating=rating,
        score=int(rng.integers(0, 100)),
        is_deleted=int(rng.random() < DELETED_FRACTION),
    )
    return post, data


SCHEMA = (
    "CREATE TABLE posts ("
    "id INTEGER PRIMARY KEY, md5 TEXT NOT NULL, file_ext TEXT NOT NULL, tag_string TEXT NOT NULL, "
    "tag_count_general INTEGER NOT NULL, rating TEXT, score INTEGER, is_deleted INTEGER NOT NULL DEFAULT 0)"
)


def _write_database(path: Path, posts: list[Post]) -> None:
    """Build beside the target and rename, so an interrupted run leaves no half database."""
    temporary = path.with_name(f".{path.name}.tmp")
    if temporary.exists():
        temporary.unlink()
    # Created by open(), not by SQLite (which uses 0644 whatever the umask allows), so the mode is open()'s.
    temporary.touch()
    connection = sqlite3.connect(temporary)
    try:
        with connection:
            connection.execute(SCHEMA)
            connection.executemany(
                "INSERT INTO posts (id, md5, file_ext, tag_string, tag_count_general, rating, score, is_deleted) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(p.id, p.md5, p.file_ext, p.tag_string, len(p.tags), p.rating, p.score, p.is_deleted)
                 for p in posts],
            )
    finally:
        connection.close()
    os.replace(temporary, path)


def _write_image(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def generate_sample_dataset(
    directory,
    count: int = 200,
    size: int = 64,
    seed: int = 0,
    image_format: str = "jpg",
    overwrite: bool = False,
    reuse_identical: bool = False,
    preset: str = "basic",
) -> tuple[Path, list[str]]:
    """Write DIR/dataset.sqlite, DIR/images/<md5[0:2]>/<md5>.<ext> and DIR/tags.txt.

    Returns (database path, tags). Equal arguments give byte-identical files. With
    reuse_identical, a complete dataset made earlier with the same arguments is kept as it is.
    """
    directory = Path(directory)
    if image_format not in FORMATS:
        raise DatasetError(f"image format {image_format!r} is not one of {', '.join(FORMATS)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DatasetError(f"count must be a positive integer, got {count!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise DatasetError(f"size must be an integer >= 16, got {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DatasetError(f"seed must be an integer >= 0, got {seed!r}")
    module = preset_module(preset)
    if directory.exists() and not directory.is_dir():
        raise DatasetError(f"{directory}: exists and is not a directory")
    database = directory / DATABASE_NAME
    recipe = _recipe(count, size, seed, image_format, preset)
    tags = list(module.TAGS)
    if database.exists() and not overwrite:
        if reuse_identical and existing_recipe(directory) == recipe:
            return database, tags
        raise DatasetError(file_field(database, None, "already exists; use --overwrite to replace it"))

    images = directory / "images"
    taken: set[str] = set()
    posts = []
    for index in range(count):
        post, data = make_post(seed, index, size, image_format, taken, module.draw_picture)
        _write_image(images / post.md5[:2] / f"{post.md5}.{post.file_ext}", data)
        posts.append(post)
    directory.mkdir(parents=True, exist_ok=True)
    _write_database(database, posts)
    write_text_atomic(directory / TAGS_NAME, "\n".join(tags) + "\n")
    # Written last: its presence says the dataset above is complete and what made it.
    write_text_atomic(directory / RECIPE_NAME, json.dumps(recipe, indent=2) + "\n")
    return database, tags


def _recipe(count, size, seed, image_format, preset) -> dict:
    recipe = {"generator": RECIPE_VERSION, "count": count, "size": size, "seed": seed, "format": image_format}
    version = PRESETS[preset][1]
    if version is not None:
        recipe.update(preset=preset, preset_version=version)
    return recipe


def existing_recipe(directory) -> dict | None:
    """The parameters a complete earlier run wrote to DIR/sample.json, or None."""
    try:
        return json.loads((Path(directory) / RECIPE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def project_using(database: Path) -> Path | None:
    """The project folder just above the dataset whose project.json already reads DATABASE (the sample
    project's own layout), so the advice after generating does not ask for keys that are already set."""
    resolved = Path(database).resolve()
    project = resolved.parent.parent
    try:
        config = json.loads((project / "project.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path = config.get("database_path") if isinstance(config, dict) else None
    if not isinstance(path, str) or not (project / "tags.txt").is_file() or (project / path).resolve() != resolved:
        return None
    return Path(database).parent.parent
