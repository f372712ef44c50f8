"""One slice of the epoch order -> the pipeline's dataset plus the bad-image accounting for it."""

from __future__ import annotations

import numpy as np

from deepdanbooru.pipeline import BadImageTracker, training_dataset


class EpochPaths:
    """paths[position] of the epoch order, without materialising a list per epoch."""

    def __init__(self, paths, order: np.ndarray):
        self._paths = paths
        self._order = order

    def __getitem__(self, position: int) -> str:
        return self._paths[int(self._order[position])]

    def __len__(self) -> int:
        return len(self._order)


class SliceData:
    """The slice's dataset; `observe` each batch's positions, then `finish` for the number of bad images."""

    def __init__(self, dataset, tracker: BadImageTracker, start: int, count: int):
        self.dataset = dataset
        self.tracker = tracker
        self.start = start
        self.count = count

    def observe(self, local_positions) -> None:
        # One tensor per local replica; positions live on the host, so this does not wait for the step.
        self.tracker.observe(np.concatenate([np.asarray(p) for p in local_positions]))

    def finish(self) -> int:
        return self.tracker.finish(self.start, self.count)


def slice_dataset(config, tags, paths, tag_strings, order: np.ndarray, *, start: int, stop: int,
                  random_seed: int, epoch: int, bad_image_log) -> SliceData:
    """Records order[start:stop] at epoch positions start..stop-1."""
    indices = order[start:stop]
    dataset = training_dataset(
        [paths[i] for i in indices], [tag_strings[i] for i in indices], tags,
        height=config.image_height, width=config.image_width,
        rotation_range=config.rotation_range, scale_range=config.scale_range, shift_range=config.shift_range,
        horizontal_flip=config.horizontal_flip, crop_area_range=config.crop_area_range, mixup=config.mixup,
        seed=config.seed, random_seed=random_seed, start_position=start,
        batch_size=config.minibatch_size, max_image_pixels=config.max_image_pixels)
    tracker = BadImageTracker(bad_image_log, EpochPaths(paths, order), max_image_pixels=config.max_image_pixels,
                              context=f"epoch {epoch}")
    return SliceData(dataset, tracker, start, len(indices))
