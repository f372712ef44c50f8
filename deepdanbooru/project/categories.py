"""Which Danbooru category each tag of tags.txt belongs to. Standard library only.

download-tags writes `categories.json` beside tags.txt in DeepDanbooru's
format: a list of {"name", "start_index"} saying where each category starts in
tags.txt. Without that file a tag starting with `rating:` is a rating tag and
every other tag is unknown (None). import-model writes the same format beside
the model it imports, as `<stem>.categories.json` (`categories_beside`).

The numbers are Danbooru's category ids, which the WD tagger bundle's
`selected_tags.csv` uses too; 9 is the bundle's number for rating tags.
"""

from __future__ import annotations

import json
from pathlib import Path

from deepdanbooru.errors import TagsError, file_field

CATEGORIES_FILE = "categories.json"
GENERAL, ARTIST, COPYRIGHT, CHARACTER, META, RATING = 0, 1, 3, 4, 5, 9
# DeepDanbooru's names (lower-cased) -> id; "system" holds the rating tags.
NAMES = {"general": GENERAL, "artist": ARTIST, "copyright": COPYRIGHT, "character": CHARACTER, "meta": META,
         "system": RATING, "rating": RATING}
LABELS = {GENERAL: "general", ARTIST: "artist", COPYRIGHT: "copyright", CHARACTER: "character", META: "meta",
          RATING: "rating"}
RATING_PREFIX = "rating:"


def parse_categories(text: str, source, n_tags: int) -> list[int]:
    """One category id per tag from categories.json's text; errors name the entry."""
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise TagsError(file_field(source, None, f"is not valid JSON: {error}")) from None
    if not isinstance(entries, list) or not entries:
        raise TagsError(file_field(source, None, 'must be a non-empty list of {"name", "start_index"} objects'))
    starts: list[tuple[int, int]] = []
    for position, entry in enumerate(entries):
        field = f"entry {position + 1}"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise TagsError(file_field(source, field, 'needs a "name" string'))
        name = entry["name"]
        if name.lower() not in NAMES:
            raise TagsError(file_field(source, f"{field}.name",
                                       f"unknown category {name!r} (known: {', '.join(sorted(NAMES))})"))
        start = entry.get("start_index")
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= n_tags:
            raise TagsError(file_field(source, f"{field}.start_index",
                                       f"must be an integer in [0, {n_tags}] (tags.txt has {n_tags} tags)"))
        if starts and start < starts[-1][0]:
            raise TagsError(file_field(source, f"{field}.start_index", "is below the previous entry's"))
        starts.append((start, NAMES[name.lower()]))
    if starts[0][0] != 0:
        raise TagsError(file_field(source, "entry 1.start_index", "must be 0 (every tag needs a category)"))
    categories = []
    for index, (start, category) in enumerate(starts):
        stop = starts[index + 1][0] if index + 1 < len(starts) else n_tags
        categories.extend([category] * (stop - start))
    return categories


def categories_beside(model) -> Path:
    """The `<stem>.categories.json` import-model writes beside the model it imports (a float32 copy shares its
    model's), whether it exists or not."""
    model = Path(model)
    return model.with_name(f"{model.stem.removesuffix('.float32')}.categories.json")


def tag_categories(tags, directory) -> list[int | None]:
    """Category id per tag: from DIRECTORY/categories.json if present; `rating:` tags are always ratings."""
    return read_tag_categories(tags, Path(directory) / CATEGORIES_FILE)


def read_tag_categories(tags, path) -> list[int | None]:
    """Category id per tag: from the categories file `path` if present; `rating:` tags are always ratings."""
    path = Path(path)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TagsError(file_field(path, None, f"cannot be read: {error}")) from None
        known: list[int | None] = list(parse_categories(text, path, len(tags)))
    else:
        known = [None] * len(tags)
    return [RATING if tag.startswith(RATING_PREFIX) else category for tag, category in zip(tags, known)]


def category_indices(categories, wanted=(GENERAL, CHARACTER)) -> dict[str, list[int]]:
    """{"general": [tag indices], "character": [...]} for the wanted categories that have tags."""
    out = {}
    for category in wanted:
        indices = [index for index, value in enumerate(categories) if value == category]
        if indices:
            out[LABELS[category]] = indices
    return out
