"""What a fine-tune kept of what its source knew, in one line: at the end (and a --time-limit stop) of
train-project, and in evaluate-project --metrics on the posts the source was measured on.

The source's average precision per tag it shares with tags.txt was measured on the validation split
before the first step (training.start, logs/source_tag_ap.json). At the end the same tags' AP on the
same posts, from the run's last validation (for wise_ft the mix it exported), is set beside it. Only
tags with at least MIN_POSITIVES validation positives are counted: an AP over fewer moves by more than
LOSS when one picture changes rank, so a fall there says little. A tag "lost" when its AP fell by more
than LOSS, "gained" when it rose by more.

Without that line the end of a fine-tune shows mAP over every tag, which can rise while tags the source
did well fall (a fine-tune on a few hundred pictures lost 1 to 6 of 14-18 such tags in the measurements
of docs/quality.md, "Another source, and what 400 posts can give at most").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_POSITIVES = 10
LOSS = 0.02
NAMED = 3  # lost tags named on the line, the largest falls first


@dataclass(frozen=True)
class Kept:
    """The known tags with enough positives, and how their AP moved from the source's."""

    measured: int  # tags the source knew with >= min_positives validation positives and an AP both times
    known: int  # tags the source knew with an AP before the first step
    lost: tuple  # (tag, before, after), the largest fall first
    gained: int
    before: float | None  # their mean AP from the source
    after: float | None


def kept(source_ap: dict, support: dict, ap: dict, min_positives: int = MIN_POSITIVES, loss: float = LOSS) -> Kept:
    """source_ap/support: the start's per-tag AP and validation positives (logs/source_tag_ap.json);
    ap: tag -> AP now (None or NaN without positives)."""
    def number(value):
        return None if value is None or not math.isfinite(float(value)) else float(value)

    known = {tag: before for tag, value in source_ap.items() if (before := number(value)) is not None}
    pairs = [(tag, before, after) for tag, before in known.items()
             if support.get(tag, 0) >= min_positives and (after := number(ap.get(tag))) is not None]
    lost = sorted(((tag, b, a) for tag, b, a in pairs if a - b < -loss), key=lambda item: item[2] - item[1])
    return Kept(measured=len(pairs), known=len(known), lost=tuple(lost),
                gained=sum(1 for _, b, a in pairs if a - b > loss),
                before=sum(b for _, b, _ in pairs) / len(pairs) if pairs else None,
                after=sum(a for _, _, a in pairs) / len(pairs) if pairs else None)


def kept_on(source_ap: dict, tags, per_tag: dict) -> Kept:
    """kept() of a validation result's per-tag arrays (scoring.metrics: "ap", "support" in tags.txt order), the
    posts being those the source was measured on."""
    return kept(source_ap, {tag: int(per_tag["support"][i]) for i, tag in enumerate(tags)},
                {tag: float(per_tag["ap"][i]) for i, tag in enumerate(tags)})


def kept_summary(figures: Kept, min_positives: int = MIN_POSITIVES, loss: float = LOSS) -> str:
    """`of the 14 tags it knew with >= 10 validation positives, 2 lost more than 0.02 AP (objects 0.238 -> 0.150,
    ...), 7 gained; their mean AP 0.591 -> 0.612`, or why nothing is counted."""
    if not figures.measured:
        return (f"none of the {figures.known:,} tags it knew has {min_positives} validation positives, too few to "
                f"tell a lost tag from noise")
    if figures.lost:
        named = ", ".join(f"{tag} {before:.3f} -> {after:.3f}" for tag, before, after in figures.lost[:NAMED])
        more = f", and {len(figures.lost) - NAMED} more" if len(figures.lost) > NAMED else ""
        fell = f"{len(figures.lost)} lost more than {loss:g} AP ({named}{more})"
    else:
        fell = f"none lost more than {loss:g} AP"
    return (f"of the {figures.measured} tags it knew with >= {min_positives} validation positives, {fell}, "
            f"{figures.gained} gained; their mean AP {figures.before:.3f} -> {figures.after:.3f}")


def kept_line(figures: Kept, min_positives: int = MIN_POSITIVES, loss: float = LOSS) -> str:
    """The console's `Kept from the source: <kept_summary>; per tag: ...`."""
    return (f"Kept from the source: {kept_summary(figures, min_positives, loss)}; per tag: evaluate-project "
            f"--metrics --format json (source_ap), or the report's source model AP column")
