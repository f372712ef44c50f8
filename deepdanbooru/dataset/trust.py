"""Whether a project's split can measure anything: the warning train-project and preflight share.

Standard library only (preflight imports it). With a handful of validation
posts, or none carrying most tags, F1 and MCC are noise and the best model
and the calibrated thresholds are picked by chance; a tag with a few
training positives cannot be learnt. The run still works, so this is a
warning naming the numbers and what to change, never an error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from deepdanbooru.project.tags import count_tags
from deepdanbooru.wording import plural

MIN_VALIDATION_POSTS = 50
MIN_TRAIN_POSITIVES = 5
UNUSED_NAMED = 5  # tags named one by one before the rest are only counted


@dataclass(frozen=True)
class SplitStats:
    train_posts: int
    validation_posts: int
    tags: int
    tags_without_validation_positive: int
    rare_training_tags: int  # tags with fewer than MIN_TRAIN_POSITIVES positives among the training posts
    unused_tags: tuple[str, ...] = ()  # tags.txt lines that no eligible post holds, in tags.txt order


def split_stats(rows: Iterable[tuple[bool, str]], tags) -> SplitStats:
    """rows: (in validation, tag_string) per eligible post, streamed (preflight reads them from SQLite)."""
    tags = list(tags)
    vocabulary = set(tags)
    counts = {False: Counter(), True: Counter()}
    posts = {False: 0, True: 0}
    for validation, tag_string in rows:
        posts[validation] += 1
        count_tags((tag_string,), vocabulary, counts[validation])
    train_counts, validation_counts = counts[False], counts[True]
    return SplitStats(
        train_posts=posts[False],
        validation_posts=posts[True],
        tags=len(vocabulary),
        tags_without_validation_positive=sum(1 for tag in vocabulary if not validation_counts[tag]),
        rare_training_tags=sum(1 for tag in vocabulary if train_counts[tag] < MIN_TRAIN_POSITIVES),
        unused_tags=tuple(tag for tag in tags if not train_counts[tag] and not validation_counts[tag]),
    )


def trust_warning(stats: SplitStats, validation_fraction: float, config_path) -> str | None:
    """One line when the results of training on this split cannot be trusted; None when they can."""
    problems = []
    if validation_fraction > 0:
        small = stats.validation_posts < MIN_VALIDATION_POSTS
        empty = stats.tags and stats.tags_without_validation_positive * 2 > stats.tags
        if small or empty:
            problem = (f"the validation split is too small to measure the model: "
                       f"{plural(stats.validation_posts, 'post')}")
            if small:
                problem += f" (at least {MIN_VALIDATION_POSTS} needed)"
            if empty:
                problem += (f", {stats.tags_without_validation_positive} of {stats.tags} tags without a positive "
                            "example in it")
            problems.append(f"{problem}, so its metrics, the best model and the calibrated thresholds are noise; "
                            f"raise validation_fraction in {config_path} (now {validation_fraction:g}) or add posts")
    if stats.rare_training_tags:
        problems.append(f"{plural(stats.rare_training_tags, 'tag')} of {stats.tags} "
                        f"{'has' if stats.rare_training_tags == 1 else 'have'} fewer than {MIN_TRAIN_POSITIVES} "
                        f"positive examples among the {stats.train_posts} training posts and cannot be learnt; "
                        "add posts or drop rare tags from tags.txt (make-tags --minimum-post-count)")
    if stats.unused_tags:
        # Usually a typo in a hand-written tags.txt, or a tag only posts under minimum_tag_count hold.
        named = ", ".join(repr(tag) for tag in stats.unused_tags[:UNUSED_NAMED])
        more = len(stats.unused_tags) - UNUSED_NAMED
        verb = "occurs" if len(stats.unused_tags) == 1 else "occur"
        problems.append(f"{plural(len(stats.unused_tags), 'tag')} of tags.txt {verb} in no eligible post: "
                        f"{named}{f' and {more} more' if more > 0 else ''} (misspelt, or only on posts training "
                        "does not use?)")
    if not problems:
        return None
    return "results cannot be trusted: " + "; and ".join(problems)
