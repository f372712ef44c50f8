"""What horizontal_flip, crop_area_range and mixup cost in the input pipeline, against DeepDanbooru's augmentation.

    python bench/augmentation.py [--images 128] [--slice-batches 30] [--repeats 3] [--size 299] [--batch 32]

Generates N 512x512 JPEGs like bench/pipeline.py and times passes of
training_dataset (start-up included) for each setting, alternating them; the
figure to compare on a shared machine is images per CPU-second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline as bench  # noqa: E402

SETTINGS = {
    "deepdanbooru": {},
    "flip": {"horizontal_flip": True},
    "crop 0.87-1": {"crop_area_range": (0.87, 1.0)},
    "mixup 0.2": {"mixup": 0.2},
    "all three": {"horizontal_flip": True, "crop_area_range": (0.87, 1.0), "mixup": 0.2},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--slice-batches", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=299)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args(argv)
    from deepdanbooru.pipeline import Augmentation, TrainingInput, training_dataset

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        _, tags_path = bench.generate_dataset(scratch / "small", args.images, 512, 512, seed=1)
        paths, strings, tags = bench.load_dataset(scratch / "small", tags_path, args.images)
        paths, strings = bench.cycle(paths, strings, args.slice_batches * args.batch)

        def make(extra):
            geometry = {key: value for key, value in extra.items() if key != "mixup"}
            options = TrainingInput(args.size, args.size, Augmentation(**bench.DEFAULT_AUGMENTATION, **geometry),
                                    seed=0, batch_size=args.batch, max_image_pixels=89_478_485,
                                    mixup=extra.get("mixup"))
            return lambda: training_dataset(paths, strings, tags, options, random_seed=0, start_position=0)

        bench.compare({name: make(extra) for name, extra in SETTINGS.items()}, args.repeats, scratch, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
