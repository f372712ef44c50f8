"""What a post's other tags say of each tag: the tag's share among the posts whose tags are most alike.

For the label (post i, tag t), every other post j votes with its own label of t, weighted by how alike
the two posts' tags are *leaving t out* (Jaccard similarity of the tag sets without t, to the power
SHARPNESS, so near-identical tag sets dominate). Leaving t out keeps the label under test from choosing
its own voters, and post i never votes on itself. A post whose tags match those of posts carrying t, but
which lacks t, gets a high vote for t; a post carrying a tag none of its look-alikes carry, a low one.
The ranking (ranking.py) weighs this vote against the model's score per tag, as the data shows it.

Posts vote from a reference sample of at most REFERENCE_POSTS (seeded), in blocks of BLOCK posts, so the
similarity matrices stay at about BLOCK x REFERENCE_POSTS floats at any project size (numpy only); the labels
and the votes themselves are posts x tags arrays, which grow with the project like the scores do.
"""

from __future__ import annotations

import numpy as np

SHARPNESS = 4.0
REFERENCE_POSTS = 5000
BLOCK = 256
SMOOTHING = 0.1  # a vote with little weight behind it leans to the tag's frequency by this much weight


def tag_votes(tags: np.ndarray, columns, ids=None, seed: int = 0) -> np.ndarray:
    """tags: (posts, all tags) 0/1, the posts' labels over every tag of tags.txt; columns: the tags to vote
    on. Returns (posts, len(columns)) votes in (0, 1). ids: the posts' ids (a post never votes on itself)."""
    tags = np.asarray(tags, dtype=np.float32)
    posts = tags.shape[0]
    ids = np.arange(posts) if ids is None else np.asarray(ids)
    reference = np.arange(posts)
    if posts > REFERENCE_POSTS:
        reference = np.sort(np.random.default_rng(seed).choice(posts, REFERENCE_POSTS, replace=False))
    voters = tags[reference]  # (R, all tags)
    target = voters[:, columns]  # (R, T): the voters' labels of the tags voted on
    counts_ref = voters.sum(axis=1)
    frequency = (target.sum(axis=0) + 0.5) / (len(reference) + 1.0)
    votes = np.empty((posts, len(columns)), dtype=np.float64)
    for start in range(0, posts, BLOCK):
        block = slice(start, min(start + BLOCK, posts))
        mine = tags[block]
        overlap = mine @ voters.T  # (B, R)
        union = mine.sum(axis=1)[:, None] + counts_ref[None, :] - overlap
        with np.errstate(divide="ignore", invalid="ignore"):
            # Leaving tag t out: both carry t -> overlap - 1 and union - 1; one carries it -> union - 1.
            both = np.nan_to_num((overlap - 1) / (union - 1), nan=0.0, posinf=0.0, neginf=0.0)
            one = np.nan_to_num(overlap / (union - 1), nan=0.0, posinf=0.0, neginf=0.0)
            neither = np.nan_to_num(overlap / union, nan=0.0, posinf=0.0, neginf=0.0)
        both, one, neither = (np.clip(m, 0.0, 1.0) ** SHARPNESS for m in (both, one, neither))
        self_vote = ids[block][:, None] == ids[reference][None, :]
        for weights in (both, one, neither):
            weights[self_vote] = 0.0
        carriers_both, carriers_one = both @ target, one @ target  # weight of voters carrying t
        others_one, others_neither = one @ (1 - target), neither @ (1 - target)  # of voters lacking t
        given = mine[:, columns] > 0
        carrying = np.where(given, carriers_both, carriers_one)
        total = carrying + np.where(given, others_one, others_neither)
        votes[block] = (carrying + SMOOTHING * frequency) / (total + SMOOTHING)
    return votes
