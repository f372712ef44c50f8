"""The hard sample: scenes of up to six objects on textured, noisy backgrounds.

Made to tell recipes apart, where the basic sample is made to be learnt in
minutes. 197 tags with a long-tailed frequency: shapes and colours are
drawn with Zipf weights, so `<colour>_<shape>` pairs of the rare ones fall
far under 1% of posts. Many tags need more than colour: the count of
objects, several of one shape, the size of a shape (`large_star`), and
relations between objects (overlapping, one inside another, three in a row).

Like the basic sample, every tag is a fact about the pixels that survives
the training augmentation, rotation and horizontal flips included: objects
stay inside the safe disc, sizes differ by more than the scale range, no
tag depends on direction, and a tag holds or fails by construction (an
image not made as a row has no three centres near a line, objects not made
to overlap are apart). Tags are decided from the drawn masks where the
geometry alone would not say (the share two objects overlap).
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from deepdanbooru.sample.generator import GAP, SAFE_RADIUS, SUPERSAMPLE, _jitter

# Most frequent first: the Zipf weights follow this order.
SHAPES = ("circle", "square", "triangle", "star", "hexagon", "diamond", "cross", "heart", "ring", "crescent",
          "pentagon", "ellipse")
PLURALS = {"cross": "crosses"}
COLOURS = {
    "red": (220, 30, 30), "blue": (40, 70, 230), "green": (40, 170, 60), "yellow": (240, 220, 30),
    "white": (250, 250, 250), "black": (10, 10, 10), "orange": (245, 140, 20), "purple": (140, 50, 190),
    "pink": (245, 120, 190), "cyan": (40, 210, 220),
}
BACKGROUND_COLOURS = {
    "white": (240, 240, 240), "black": (20, 20, 20), "grey": (128, 128, 128), "beige": (225, 205, 165),
    "navy": (25, 35, 90), "olive": (110, 110, 40), "brown": (100, 60, 30), "lavender": (190, 170, 225),
}
TEXTURES = ("plain", "striped", "checkered", "dotted", "gradient", "cloudy")
# Circumradius as a fraction of the side; neighbours differ by a factor of 1.5 or more,
# beyond the 0.9-1.1 scale augmentation.
SIZES = {"small": 0.07, "medium": 0.105, "large": 0.16}
COUNT_TAGS = ("one_object", "two_objects", "three_objects", "four_objects", "five_objects", "six_objects")
COUNT_WEIGHTS = (0.2, 0.25, 0.22, 0.15, 0.1, 0.08)
RELATIONS = ("overlapping", "nested", "in_a_row", "outlined", "multicolored", "same_shape")
IMAGE_TAGS = ("heavy_noise", "blurry")

ZIPF_EXPONENT = 1.1
# One arrangement per picture: which relation it is made to show.
ARRANGEMENTS = {"overlapping": 0.25, "nested": 0.12, "in_a_row": 0.15}
# Shapes big enough inside to hold a small one (inscribed radius / circumradius).
INSCRIBED = {"circle": 1.0, "square": math.sqrt(0.5), "hexagon": math.sqrt(0.75), "pentagon": math.cos(math.pi / 5)}
# Drawn as outlines in some pictures; an outlined circle would be a ring, a crescent has no outline style.
OUTLINABLE = tuple(s for s in SHAPES if s not in ("circle", "ring", "crescent"))
OUTLINED_CHANCE = 0.1
OUTLINE_WIDTH = 0.22  # of the circumradius
HEAVY_NOISE_CHANCE = 0.1
BLURRY_CHANCE = 0.1
# An object's colour must stand out from the background: at least this RGB distance.
MIN_CONTRAST = 90.0
# Three centres closer than this (in sides) to one line read as a row; only rows are made so.
ROW_TOLERANCE = 0.07
# A made overlap covers at least the first share of the smaller object's area and hides at most
# the second share of the lower object's.
OVERLAP_SHARE = (0.08, 0.5)


def _plural(shape: str) -> str:
    return PLURALS.get(shape, shape + "s")


TAGS: tuple[str, ...] = (
    *(f"{t}_background" for t in TEXTURES),
    *(f"{c}_background" for c in BACKGROUND_COLOURS),
    *SHAPES,
    *COLOURS,
    *(f"{c}_{s}" for s in SHAPES for c in COLOURS),
    *COUNT_TAGS,
    *(f"multiple_{_plural(s)}" for s in SHAPES),
    *(f"{size}_object" for size in SIZES),
    *(f"large_{s}" for s in SHAPES),
    *RELATIONS,
    *IMAGE_TAGS,
)


def _zipf(count: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, count + 1) ** ZIPF_EXPONENT
    return weights / weights.sum()


SHAPE_P = _zipf(len(SHAPES))
COLOUR_P = _zipf(len(COLOURS))


@lru_cache(maxsize=None)
def _heart() -> tuple[tuple[float, float], ...]:
    """Unit heart outline centred on its bounding box, circumradius 1.

    Python's math, not numpy's vectorised sin/cos, whose last bit may differ between CPUs:
    the same options must give the same bytes everywhere.
    """
    t = [2 * math.pi * k / 48 for k in range(48)]
    x = [16 * math.sin(a) ** 3 for a in t]
    y = [-(13 * math.cos(a) - 5 * math.cos(2 * a) - 2 * math.cos(3 * a) - math.cos(4 * a)) for a in t]
    cx, cy = (max(x) + min(x)) / 2, (max(y) + min(y)) / 2
    x, y = [v - cx for v in x], [v - cy for v in y]
    scale = max(math.hypot(u, v) for u, v in zip(x, y))
    return tuple((u / scale, v / scale) for u, v in zip(x, y))


def _outline(kind: str) -> list[tuple[float, float]]:
    """Vertices of a unit shape (circumradius 1) for the polygon kinds."""
    def regular(n):
        return [(math.cos(2 * math.pi * k / n), math.sin(2 * math.pi * k / n)) for k in range(n)]

    if kind == "square":
        return regular(4)
    if kind == "triangle":
        return regular(3)
    if kind == "pentagon":
        return regular(5)
    if kind == "hexagon":
        return regular(6)
    if kind == "diamond":
        return [(1, 0), (0, 0.6), (-1, 0), (0, -0.6)]
    if kind == "ellipse":
        return [(math.cos(2 * math.pi * k / 40), 0.55 * math.sin(2 * math.pi * k / 40)) for k in range(40)]
    if kind == "star":
        return [((1 if k % 2 == 0 else 0.45) * math.cos(math.pi * k / 5),
                 (1 if k % 2 == 0 else 0.45) * math.sin(math.pi * k / 5)) for k in range(10)]
    if kind == "cross":
        w = 0.31
        arm = math.sqrt(1 - w * w)
        return [(arm, w), (w, w), (w, arm), (-w, arm), (-w, w), (-arm, w),
                (-arm, -w), (-w, -w), (-w, -arm), (w, -arm), (w, -w), (arm, -w)]
    if kind == "heart":
        return list(_heart())
    raise ValueError(kind)


def object_mask(kind: str, cx: float, cy: float, r: float, angle: float, outlined: bool, side: int) -> Image.Image:
    """An L mask (255 inside) of one object on a side x side canvas; coordinates in pixels."""
    mask = Image.new("L", (side, side), 0)
    pen = ImageDraw.Draw(mask)
    width = max(1, round(OUTLINE_WIDTH * r)) if outlined else 0
    if kind in ("circle", "ring", "crescent"):
        box = (cx - r, cy - r, cx + r, cy + r)
        if outlined:
            pen.ellipse(box, outline=255, width=width)
        else:
            pen.ellipse(box, fill=255)
        if kind == "ring":
            hole = 0.55 * r
            pen.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=0)
        elif kind == "crescent":
            bite, offset = 0.8 * r, 0.45 * r
            bx, by = cx + offset * math.cos(angle), cy + offset * math.sin(angle)
            pen.ellipse((bx - bite, by - bite, bx + bite, by + bite), fill=0)
        return mask
    cos, sin = math.cos(angle), math.sin(angle)
    points = [(cx + r * (x * cos - y * sin), cy + r * (x * sin + y * cos)) for x, y in _outline(kind)]
    if outlined:
        pen.polygon(points, outline=255, width=width)
    else:
        pen.polygon(points, fill=255)
    return mask


@lru_cache(maxsize=8)
def _grid(side: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres in units of the side, origin at the middle."""
    axis = ((np.arange(side) + 0.5) / side - 0.5).astype(np.float32)
    return np.meshgrid(axis, axis)


def _second_tone(rgb) -> tuple[int, int, int]:
    """A lighter tone of a dark colour, a darker one of a light colour."""
    shift = 45 if sum(rgb) < 384 else -45
    return tuple(int(np.clip(c + shift, 0, 255)) for c in rgb)


def _background(rng: np.random.Generator, texture: str, base, side: int) -> np.ndarray:
    """side x side x 3 float32 array of the textured background."""
    x, y = _grid(side)
    first, second = np.array(base, dtype=np.float32), np.array(_second_tone(base), dtype=np.float32)
    period = 0.08 + 0.06 * rng.random()
    theta = math.pi * rng.random()
    u = x * math.cos(theta) + y * math.sin(theta)
    v = -x * math.sin(theta) + y * math.cos(theta)
    if texture == "plain":
        share = np.zeros_like(x)
    elif texture == "striped":
        share = np.floor(u / period) % 2
    elif texture == "checkered":
        share = (np.floor(u / period) + np.floor(v / period)) % 2
    elif texture == "dotted":
        du = (u / period) % 1 - 0.5
        dv = (v / period) % 1 - 0.5
        share = (du * du + dv * dv < 0.28 * 0.28).astype(np.float32)
    elif texture == "gradient":
        share = np.clip(u + 0.5, 0, 1)
    else:  # cloudy: smooth blotches from a coarse random field
        coarse = Image.fromarray((rng.random((6, 6)) * 255).astype(np.uint8), "L")
        share = np.asarray(coarse.resize((side, side), Image.Resampling.BICUBIC), dtype=np.float32) / 255
    return first + share[..., None] * (second - first)


def _contrasting(rng: np.random.Generator, tones) -> str:
    names = list(COLOURS)
    for _ in range(100):
        name = names[rng.choice(len(names), p=COLOUR_P)]
        if all(math.dist(COLOURS[name], tone) >= MIN_CONTRAST for tone in tones):
            return name
    raise AssertionError("no contrasting colour")  # every background has several


def _near_line(a, b, m, tolerance: float) -> bool:
    """Whether m lies between a and b within tolerance of the line through them."""
    d = (b[0] - a[0], b[1] - a[1])
    e = (m[0] - a[0], m[1] - a[1])
    length2 = d[0] * d[0] + d[1] * d[1]
    if length2 == 0:
        return False
    t = (e[0] * d[0] + e[1] * d[1]) / length2
    return 0 < t < 1 and abs(d[0] * e[1] - d[1] * e[0]) / math.sqrt(length2) < tolerance


def _looks_like_a_row(points, made: tuple[int, ...] = ()) -> bool:
    """Whether any three points other than the made row lie near one line."""
    for triple in combinations(range(len(points)), 3):
        if triple == made:
            continue
        a, b, c = (points[i] for i in triple)
        if _near_line(a, b, c, ROW_TOLERANCE) or _near_line(a, c, b, ROW_TOLERANCE) \
                or _near_line(b, c, a, ROW_TOLERANCE):
            return True
    return False


def _inside(x: float, y: float, r: float) -> bool:
    return math.hypot(x, y) <= SAFE_RADIUS - r


def _apart(centres, radii, x, y, r) -> bool:
    return all(math.hypot(x - u, y - v) >= r + q + GAP for (u, v), q in zip(centres, radii))


def _uniform_in_disc(rng, reach: float) -> tuple[float, float]:
    rho = reach * math.sqrt(rng.random())
    theta = 2 * math.pi * rng.random()
    return rho * math.cos(theta), rho * math.sin(theta)


def _place(rng: np.random.Generator, radii: list[float], arrangement: str | None, outer_shape: str,
           outlined_outer: bool) -> list[tuple[float, float]] | None:
    """Centres for the objects (units of the side, origin at the middle), or None when they do not fit."""
    centres: list[tuple[float, float]] = []
    first = 0
    if arrangement == "nested":
        x, y = _uniform_in_disc(rng, SAFE_RADIUS - radii[0])
        band = OUTLINE_WIDTH * radii[0] if outlined_outer else 0.0
        room = max(0.0, INSCRIBED[outer_shape] * radii[0] - band - radii[1] - 0.01)
        dx, dy = _uniform_in_disc(rng, room)
        centres = [(x, y), (x + dx, y + dy)]
        first = 2
    elif arrangement == "overlapping":
        x, y = _uniform_in_disc(rng, SAFE_RADIUS - radii[0])
        # bounding circles cut, neither holds the other's centre
        distance = max((0.45 + 0.3 * rng.random()) * (radii[0] + radii[1]),
                       abs(radii[0] - radii[1]) + 0.3 * min(radii[:2]))
        theta = 2 * math.pi * rng.random()
        second = (x + distance * math.cos(theta), y + distance * math.sin(theta))
        if not _inside(*second, radii[1]):
            return None
        centres = [(x, y), second]
        first = 2
    elif arrangement == "in_a_row":
        spacing = 2 * max(radii[:3]) + GAP + 0.04 * rng.random()
        theta = 2 * math.pi * rng.random()
        reach = SAFE_RADIUS - spacing - max(radii[:3])
        if reach < 0:
            return None
        mx, my = _uniform_in_disc(rng, reach)
        centres = [(mx + k * spacing * math.cos(theta), my + k * spacing * math.sin(theta)) for k in (-1, 0, 1)]
        if not all(_inside(x, y, r) for (x, y), r in zip(centres, radii)):
            return None
        first = 3
    # The rest keep clear of every bounding circle, so they overlap nothing.
    for index in range(first, len(radii)):
        for _ in range(60):
            x, y = _uniform_in_disc(rng, SAFE_RADIUS - radii[index])
            if _apart(centres, radii[:len(centres)], x, y, radii[index]):
                centres.append((x, y))
                break
        else:
            return None
    # A nested pair reads as one place.
    seen = centres[1:] if arrangement == "nested" else centres
    if _looks_like_a_row(seen, (0, 1, 2) if arrangement == "in_a_row" else ()):
        return None
    return centres


def _spec(rng: np.random.Generator) -> dict:
    """What one picture shows, before placing it."""
    texture = TEXTURES[rng.integers(len(TEXTURES))]
    background = list(BACKGROUND_COLOURS)[rng.integers(len(BACKGROUND_COLOURS))]
    count = 1 + int(rng.choice(len(COUNT_TAGS), p=COUNT_WEIGHTS))
    roll, arrangement = rng.random(), None
    for name, chance in ARRANGEMENTS.items():
        if roll < chance and count >= (3 if name == "in_a_row" else 2):
            arrangement = name
            break
        roll -= chance
    shapes = [SHAPES[rng.choice(len(SHAPES), p=SHAPE_P)] for _ in range(count)]
    sizes = [list(SIZES)[rng.integers(len(SIZES))] for _ in range(count)]
    tones = (BACKGROUND_COLOURS[background], _second_tone(BACKGROUND_COLOURS[background]))
    colours = [_contrasting(rng, tones) for _ in range(count)]
    if arrangement == "nested":
        nestable = list(INSCRIBED)
        weights = np.array([SHAPE_P[SHAPES.index(s)] for s in nestable])
        shapes[0] = nestable[rng.choice(len(nestable), p=weights / weights.sum())]
        sizes[0], sizes[1] = "large", "small"
        while colours[1] == colours[0]:
            colours[1] = _contrasting(rng, tones)
    elif arrangement == "in_a_row":
        # three large objects in a row do not fit in the safe disc
        for index in range(3):
            if sizes[index] == "large":
                sizes[index] = "medium"
    outlined = [shape in OUTLINABLE and rng.random() < OUTLINED_CHANCE for shape in shapes]
    angles = [2 * math.pi * rng.random() for _ in range(count)]
    return {"texture": texture, "background": background, "arrangement": arrangement, "shapes": shapes,
            "sizes": sizes, "colours": colours, "outlined": outlined, "angles": angles,
            "heavy_noise": rng.random() < HEAVY_NOISE_CHANCE, "blurry": rng.random() < BLURRY_CHANCE}


def _overlap_ok(under: np.ndarray, over: np.ndarray) -> bool:
    """A made overlap: a visible share of the smaller object hidden, most of the lower one still seen."""
    shared = np.count_nonzero(under & over)
    low, high = OVERLAP_SHARE
    smaller = min(np.count_nonzero(under), np.count_nonzero(over))
    return shared >= low * smaller and shared <= high * np.count_nonzero(under)


def _layout(rng: np.random.Generator, spec: dict, side: int) -> list[Image.Image] | None:
    """The objects' masks on the supersampled canvas, in drawing order, or None when they do not fit.

    A crowded picture that does not fit shrinks its largest free object a size and tries again
    (the sizes of a made nest stay), so the count keeps its weight.
    """
    sizes = spec["sizes"]
    fixed = (0, 1) if spec["arrangement"] == "nested" else ()
    names = list(SIZES)
    while True:
        radii = [SIZES[size] for size in sizes]
        for _ in range(10):
            centres = _place(rng, radii, spec["arrangement"], spec["shapes"][0], spec["outlined"][0])
            if centres is None:
                continue
            masks = [object_mask(kind, (0.5 + x) * side, (0.5 + y) * side, r * side, angle, outlined, side)
                     for kind, (x, y), r, angle, outlined
                     in zip(spec["shapes"], centres, radii, spec["angles"], spec["outlined"])]
            if spec["arrangement"] == "overlapping" and not _overlap_ok(
                    np.asarray(masks[0]) > 127, np.asarray(masks[1]) > 127):
                continue
            return masks
        free = [i for i in range(len(sizes)) if i not in fixed and sizes[i] != names[0]]
        if not free:
            return None
        largest = max(free, key=lambda i: (names.index(sizes[i]), -i))
        sizes[largest] = names[names.index(sizes[largest]) - 1]


def _tags(spec: dict) -> set[str]:
    shapes, colours = spec["shapes"], spec["colours"]
    present = {f"{spec['texture']}_background", f"{spec['background']}_background", *shapes, *colours,
               COUNT_TAGS[len(shapes) - 1]}
    present |= {f"{colour}_{shape}" for colour, shape in zip(colours, shapes)}
    present |= {f"multiple_{_plural(shape)}" for shape in shapes if shapes.count(shape) > 1}
    present |= {f"{size}_object" for size in spec["sizes"]}
    present |= {f"large_{shape}" for shape, size in zip(shapes, spec["sizes"]) if size == "large"}
    if spec["arrangement"]:
        present.add(spec["arrangement"])
    if any(spec["outlined"]):
        present.add("outlined")
    if len(set(colours)) > 1:
        present.add("multicolored")
    if len(shapes) > 1 and len(set(shapes)) == 1:
        present.add("same_shape")
    present |= {name for name in IMAGE_TAGS if spec[name]}
    return present


def draw_picture(rng: np.random.Generator, size: int) -> tuple[Image.Image, tuple[str, ...]]:
    """One RGB picture and its tags, in TAGS order."""
    side = size * SUPERSAMPLE
    while True:
        spec = _spec(rng)
        masks = _layout(rng, spec, side)
        if masks is not None:
            break
    base = _jitter(rng, BACKGROUND_COLOURS[spec["background"]], 8)
    canvas = _background(rng, spec["texture"], base, side)
    for mask, colour in zip(masks, spec["colours"]):
        fill = np.array(_jitter(rng, COLOURS[colour], 15), dtype=np.float32)
        left, top, right, bottom = mask.getbbox() or (0, 0, 0, 0)
        alpha = np.asarray(mask.crop((left, top, right, bottom)), dtype=np.float32)[..., None] / 255
        box = canvas[top:bottom, left:right]
        box += alpha * (fill - box)
    picture = Image.fromarray(np.rint(canvas).astype(np.uint8), "RGB").resize((size, size), Image.Resampling.BOX)
    if spec["blurry"]:
        picture = picture.filter(ImageFilter.GaussianBlur(radius=size / 64))
    sigma = 22.0 if spec["heavy_noise"] else 3.0 + 5.0 * rng.random()
    noisy = np.asarray(picture, dtype=np.float64) + rng.normal(0.0, sigma, (size, size, 3))
    picture = Image.fromarray(np.clip(np.rint(noisy), 0, 255).astype(np.uint8), "RGB")
    present = _tags(spec)
    return picture, tuple(tag for tag in TAGS if tag in present)
