"""Packed shards: what `deepdanbooru pack` made them from, and whether training may read them (standard library).

PROJECT/shards/ holds TFRecord files (`shard-00000.tfrecord`, ...) of
tf.train.Example records (the picture re-encoded at the training box, its
label indices in tags.txt order, its path under images/), one index per shard
(`shard-00000.json`: where each record starts in the file, and the pictures
that failed to decode while packing, with the reason) and `manifest.json`,
written last, that lists them with what they were made from. Training reads a
shard folder only through its manifest, so an unfinished pack is never read.
training_shards() is the one rule for whether train-project reads the shards
(and refuses them when it must); preflight applies the same function.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import ConfigError, TrainingError, file_field

SHARDS_DIR = "shards"
MANIFEST = "manifest.json"
PLAN = "plan.json"
FORMAT = 1
# About 150 MB per shard: 1536x2048 originals packed at 448 took 50 kB each, 0.21 byte per pixel of the
# 492x492 box (bench/pipeline.py --packed); 0.25 leaves room for busier pictures.
TARGET_SHARD_BYTES = 150 * 2**20
BYTES_PER_PIXEL_GUESS = 0.25
# What fills the box around a picture whose aspect differs from the output's: the warp's clamped
# coordinates replicate the border pixels.


def box_factor(scale_range, crop_area_range) -> float:
    """Pictures are fitted into the output size times this, so the largest zoom still samples real pixels."""
    scale_max = scale_range[1] if scale_range else 1.0
    if not crop_area_range:
        return scale_max
    return scale_max / math.sqrt(crop_area_range[0])


def training_box(config) -> tuple[float, float]:
    """The (height, width) box training fits each picture into."""
    factor = box_factor(config.scale_range, config.crop_area_range)
    return config.image_height * factor, config.image_width * factor


def pack_box(config) -> tuple[int, int]:
    """The box the shards' pictures are fitted into: the training box rounded down, so that training finds
    them inside its box and only warps them (a picture a rounding over the box would be area-resized again,
    to the same size, which costs as much as decoding it)."""
    return tuple(int(math.floor(side + 1e-6)) for side in training_box(config))


TRAINING_PART, VALIDATION_PART = "shard", "validation"


def shard_name(number: int, part: str = TRAINING_PART) -> str:
    return f"{part}-{number:05d}.tfrecord"


def index_name(number: int, part: str = TRAINING_PART) -> str:
    return f"{part}-{number:05d}.json"


def record_key(path: str, images_dir) -> str:
    """The path under images/, which survives the project moving."""
    prefix = f"{images_dir}/"
    if path.startswith(prefix):  # always, for Records.paths(); slicing is 10x cheaper than relpath
        return path[len(prefix):]
    return os.path.relpath(path, images_dir).replace(os.sep, "/")


def tags_digest(tags_path) -> str:
    return hashlib.sha256(Path(tags_path).read_bytes()).hexdigest()


def records_digest(keys, tag_strings) -> str:
    digest = hashlib.sha256()
    for key, tag_string in zip(keys, tag_strings):
        digest.update(f"{key}\t{tag_string}\n".encode("utf-8"))
    return digest.hexdigest()


def encoding(config) -> str:
    """How packed pictures are stored: JPEG at project.json's pack_quality, chroma halved both ways."""
    return f"jpeg quality {config.pack_quality} 4:2:0"


def made_from(root, config, tags_path, records) -> dict:
    """Everything the shards' content depends on; training refuses shards whose values differ."""
    images_dir = records.images_dir
    keys = [record_key(path, images_dir) for path in records.paths()]
    return {
        "format": FORMAT,
        "project": str(Path(root).resolve()),
        "image_size": [config.image_height, config.image_width],
        "box": list(pack_box(config)),
        "alpha": config.alpha,
        "encoding": encoding(config),
        "max_image_pixels": config.max_image_pixels,
        "tags_sha256": tags_digest(tags_path),
        "database": str(records.database_path),
        "records": len(records),
        "records_sha256": records_digest(keys, records.tag_strings),
    }


def validation_made_from(config, tags_path, records) -> dict:
    """What the validation part depends on: the validation records (`records`), fitted as scoring fits them."""
    keys = [record_key(path, records.images_dir) for path in records.paths()]
    return {
        "format": FORMAT,
        "box": [config.image_height, config.image_width],
        "alpha": config.alpha,
        "encoding": encoding(config),
        "max_image_pixels": config.max_image_pixels,
        "tags_sha256": tags_digest(tags_path),
        "records": len(records),
        "records_sha256": records_digest(keys, records.tag_strings),
    }


def rebuild_command(root) -> str:
    return f"deepdanbooru pack {root}"


# Fields whose change makes shards stale, and how the refusal names the change.
_CHECKED = (
    ("format", "were written by another version of deepdanbooru"),
    ("image_size", "were packed for image_height x image_width {was}, project.json now says {now}"),
    ("box", "were packed into a {was} box, the augmentation's scale/crop now needs {now}"),
    ("alpha", "were packed with alpha {was} (transparency settled when packing), project.json now says {now}"),
    ("encoding", "were stored as {was}, project.json's pack_quality now asks for {now}"),
    ("max_image_pixels", "were packed with max_image_pixels {was}, project.json now says {now}"),
    ("tags_sha256", "were labelled with another tags.txt (it changed since packing)"),
    ("records_sha256", "were made from other database records ({was_records} then, {now_records} now, "
                       "or their tags changed)"),
)


def stale_reasons(packed: dict, current: dict) -> list[str]:
    reasons = []
    for key, text in _CHECKED:
        if packed.get(key) != current.get(key):
            reasons.append(text.format(was=packed.get(key), now=current.get(key),
                                       was_records=packed.get("records"), now_records=current.get("records")))
    return reasons


@dataclass
class ShardIndex:
    """Where each packed picture lies; what was wrong with the pictures that are not there."""

    directory: Path
    files: list[Path]
    sizes: list[int]  # bytes each shard had when packed
    locations: dict[str, tuple[int, int, int]]  # image path -> (shard number, offset, length) of its Example
    bad: dict[str, str]  # image path -> why it could not be packed (as bad_images.txt words it)
    rebuild: str
    truncated: dict[int, int] = field(default_factory=dict)  # shard number -> bytes found

    def warnings(self) -> list[str]:
        return [f"{self.files[number]}: truncated ({found:,} of {self.sizes[number]:,} bytes); its pictures "
                f"are skipped as bad images, the other shards are used; `{self.rebuild}` repairs it"
                for number, found in sorted(self.truncated.items())]

    def known_reason(self, path: str) -> str | None:
        """Why the picture at `path` cannot come from the shards, when that is known without reading it."""
        if path in self.bad:
            return self.bad[path]
        location = self.locations.get(path)
        if location is None:
            return f"not in {self.directory} (pack again: `{self.rebuild}`)"
        number, offset, length = location
        if number in self.truncated and offset + length > self.truncated[number]:
            return f"truncated: in {self.files[number]}, which ends early; `{self.rebuild}` repairs it"
        return None


def read_shard_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TrainingError(file_field(path, None, f"unreadable ({error}); rebuild the shards with "
                                                   f"`{rebuild_command(path.parent.parent)}`")) from None
    if not isinstance(value, dict):
        raise TrainingError(file_field(path, None, "not a shard manifest or index"))
    return value


def open_shards(root, config, tags_path, records) -> ShardIndex | None:
    """The project's shards when packing finished and they match what training would read; None without shards.

    Raises TrainingError (one line, with the command that rebuilds them) for
    an unfinished pack and for shards made from something else: another
    project, another tags.txt, database, image size, box or alpha.
    """
    root = Path(root)
    directory = root / SHARDS_DIR
    if not directory.is_dir():
        return None
    rebuild = rebuild_command(root)
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        if not any(directory.iterdir()):
            return None
        raise TrainingError(file_field(
            directory, None, f"packing did not finish (no {MANIFEST}); finish it with `{rebuild}`, or delete the "
                             "folder to train from the original images"))
    manifest = read_shard_json(manifest_path)
    packed = manifest.get("made_from", {})
    current = made_from(root, config, tags_path, records)
    reasons = stale_reasons(packed, current)
    if reasons:
        origin = packed.get("project")
        other = f" (packed when the project was at {origin})" if origin and origin != current["project"] else ""
        raise TrainingError(file_field(
            manifest_path, None, f"stale shards{other}: they {'; they '.join(reasons)}; rebuild them with "
                                 f"`{rebuild}`"))
    return read_shard_set(directory, prefix=f"{records.images_dir}/", rebuild=rebuild, manifest=manifest)


def read_shard_set(directory, prefix: str, rebuild: str | None = None, manifest: dict | None = None) -> ShardIndex:
    """The indexes of the shard set in `directory` (whose manifest is finished), keyed by prefix + key."""
    directory = Path(directory)
    rebuild = rebuild or rebuild_command(directory.parent)
    manifest = manifest if manifest is not None else read_shard_json(directory / MANIFEST)
    files, sizes, locations, bad, truncated = [], [], {}, {}, {}
    for number, entry in enumerate(manifest.get("shards", [])):
        index = read_shard_json(directory / entry["index"])
        files.append(directory / entry["file"])
        sizes.append(int(index["bytes"]))
        for key, offset, length in index["records"]:
            locations[f"{prefix}{key}"] = (number, int(offset), int(length))
        for key, reason in index["bad"]:
            bad[f"{prefix}{key}"] = reason
        try:
            found = files[-1].stat().st_size
        except FileNotFoundError:
            found = 0
        if found < sizes[-1]:
            truncated[number] = found
    return ShardIndex(directory, files, sizes, locations, bad, rebuild, truncated)


def scoring_shards(root, config, records, size) -> tuple[ShardIndex | None, str | None]:
    """(the packed validation part, None) when it holds every picture of `records` fitted at `size` (height, width).

    Otherwise (None, a notice saying why and how to pack it), and the pictures are read from their original
    files; (None, None) for a project without a finished shard set. Only the pictures come from the part:
    labels come from the records being scored, so a tags.txt change needs no repacking here.
    """
    root = Path(root)
    directory = root / SHARDS_DIR
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return None, None
    rebuild = rebuild_command(root)
    fallback = "the pictures are read from their original files"
    manifest = read_shard_json(manifest_path)
    part = manifest.get("validation")
    if not isinstance(part, dict):
        return None, (f"notice: {directory} has no validation part (packed before validation pictures were "
                      f"packed); {fallback}; `{rebuild}` adds it and keeps the training shards")
    packed = part.get("made_from", {})
    wanted = {"format": FORMAT, "box": [int(size[0]), int(size[1])], "alpha": config.alpha,
              "max_image_pixels": config.max_image_pixels}
    changed = [key for key, value in wanted.items() if packed.get(key) != value]
    if changed:
        return None, (f"notice: {directory}: the validation pictures were packed with "
                      + ", ".join(f"{key} {packed.get(key)}" for key in changed) + " and scoring now needs "
                      + ", ".join(f"{key} {wanted[key]}" for key in changed)
                      + f"; {fallback}; `{rebuild}` repacks them")
    try:
        index = read_shard_set(directory, prefix=f"{records.images_dir}/", rebuild=rebuild, manifest=part)
    except TrainingError as error:
        return None, f"notice: {error}; {fallback}"
    if index.truncated:
        return None, (f"notice: {directory}: a validation shard is missing or cut short; {fallback}; `{rebuild}` "
                      "packs it again")
    paths = records.paths()
    missing = sum(1 for path in paths if str(path) not in index.locations and str(path) not in index.bad)
    if missing:
        return None, (f"notice: {missing} of the {len(paths)} pictures to score are not in {directory}'s validation "
                      f"part (the split or the database changed since packing); {fallback}; `{rebuild}` packs them")
    return index, None


def training_shards(root, config, tags_path, records) -> ShardIndex | None:
    """The shards train-project reads its training pictures from; None when it reads the original files.

    open_shards' refusals, and one more: the shard reader is host memory mapped into the training
    process's graph, so data-service workers (project.json data_service) cannot run it (ConfigError).
    """
    shards = open_shards(root, config, tags_path, records)
    if shards is not None and config.data_service:
        raise ConfigError(file_field(config.config_path, "data_service", (
            f"cannot serve the packed shards in {shards.directory}; set data_service to null to train from them "
            "here, or move the shards folder aside to have the workers read the original files")))
    return shards
