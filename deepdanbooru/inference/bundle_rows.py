"""Which score goes in which row of a WD-style bundle. Standard library only.

The tools that read such a bundle index the scores by position: kohya's
tag_images_by_wd14_tagger takes outputs 0-3 as ratings and 4 + i as the i-th
general tag of the CSV, then the characters; the WebUI tagger takes the first
four CSV rows as ratings and everything after as tags. So the rows are
exactly: WD's four ratings (general, sensitive, questionable, explicit), then
general tags, then character tags, nothing else, whatever the project's
vocabulary:

- a rating tag maps to the WD rating of the same meaning by its name after
  `rating:`: general, sensitive, questionable, explicit as such, and
  DeepDanbooru's `safe` (Danbooru's rating before it was split into general
  and sensitive) to general. A WD rating no project tag maps to is a constant
  row scoring 0; where two tags map to one rating the exact name wins;
- tags of unknown category count as general;
- rating tags that map to nothing, copyright, artist and meta tags are
  dropped: one more row anywhere would shift every score after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdanbooru.project import categories as cat

WD_RATINGS = ("general", "sensitive", "questionable", "explicit")
# Names (after "rating:") by preference: the WD name itself first.
RATING_SOURCES = {"general": ("general", "safe"), "sensitive": ("sensitive",),
                  "questionable": ("questionable",), "explicit": ("explicit",)}
BUNDLE_CATEGORIES = (cat.RATING, cat.GENERAL, cat.CHARACTER)


@dataclass(frozen=True)
class Row:
    name: str  # as WD writes it: ratings without "rating:"
    category: int  # Danbooru's id, as selected_tags.csv writes it
    source: int | None  # index in tags.txt; None: a constant row scoring 0


@dataclass(frozen=True)
class BundleRows:
    rows: tuple[Row, ...]
    dropped: dict  # category label -> [tags.txt names], only categories with any

    @property
    def sources(self) -> list[int | None]:
        return [row.source for row in self.rows]

    @property
    def measured(self) -> list[int]:
        """Positions of the rows that carry a project tag (the constant rows have nothing to measure)."""
        return [position for position, row in enumerate(self.rows) if row.source is not None]

    @property
    def constant(self) -> list[str]:
        return [row.name for row in self.rows if row.source is None]

    def positions(self, category: int) -> list[int]:
        return [position for position, row in enumerate(self.rows) if row.category == category]

    def rating_sources(self, tags) -> dict:
        """WD rating -> the tags.txt tag feeding it (None: constant 0)."""
        return {row.name: None if row.source is None else tags[row.source]
                for row in self.rows if row.category == cat.RATING}


def _rating_name(tag: str) -> str:
    return tag[len(cat.RATING_PREFIX):] if tag.startswith(cat.RATING_PREFIX) else tag


def plan_rows(tags, categories) -> BundleRows:
    """The bundle's rows for tags.txt `tags` of `categories` (project.categories.tag_categories)."""
    known = [cat.GENERAL if value is None else value for value in categories]
    rating_tags = [index for index, value in enumerate(known) if value == cat.RATING]
    used = set()
    rows = []
    by_name = {_rating_name(tags[index]): index for index in reversed(rating_tags)}  # the first of duplicates
    for rating in WD_RATINGS:
        source = next((by_name[name] for name in RATING_SOURCES[rating] if name in by_name), None)
        if source is not None:
            used.add(source)
        rows.append(Row(rating, cat.RATING, source))
    for category in (cat.GENERAL, cat.CHARACTER):
        rows += [Row(tags[index], category, index) for index, value in enumerate(known) if value == category]
    dropped: dict[str, list[str]] = {}
    for index, value in enumerate(known):
        if value not in BUNDLE_CATEGORIES or (value == cat.RATING and index not in used):
            dropped.setdefault(cat.LABELS.get(value, str(value)), []).append(tags[index])
    return BundleRows(tuple(rows), dropped)
