"""deepdanbooru pack --verify: read every record of a packed shard set and check it, without training.

Each record is read at the offset its index gives, its TFRecord CRCs checked
(what training does for every picture it reads) and its Example parsed; a bad
record is named with its shard, byte offset and picture.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from deepdanbooru.errors import TrainingError, file_field
from deepdanbooru.project.shards import MANIFEST, SHARDS_DIR, read_shard_json, read_shard_set
from deepdanbooru.wording import plural


@dataclass
class VerifySummary:
    records: int = 0
    bad: list[str] = field(default_factory=list)  # one line per bad record
    seconds: float = 0.0


def verify_shards(project_dir, echo=print, progress=contextlib.nullcontext) -> VerifySummary:
    """Check every record of PROJECT/shards; `progress(keys)`: a context giving the keys to walk (the command
    line's progress bar)."""
    import tensorflow as tf

    from deepdanbooru.pipeline.packed import FEATURES, ShardReader

    began = time.perf_counter()
    directory = Path(project_dir) / SHARDS_DIR
    if not (directory / MANIFEST).is_file():
        raise TrainingError(file_field(directory / MANIFEST, None, "no finished shard set to verify (run "
                                                                   f"`deepdanbooru pack {project_dir}` first)"))
    manifest = read_shard_json(directory / MANIFEST)
    # The training part, and the validation part that scoring reads (both are read as training reads them).
    parts = [("", read_shard_set(directory, prefix="", manifest=manifest))]
    if isinstance(manifest.get("validation"), dict):
        parts.append(("validation ", read_shard_set(directory, prefix="", manifest=manifest["validation"])))
    summary = VerifySummary()
    walked = [(label, index, reader, key) for label, index in parts
              for reader in [ShardReader(index)] for key in index.locations]
    files = sum(len(index.files) for _, index in parts)
    echo(f"Verifying {plural(len(walked), 'record')} in {plural(files, 'shard')} of {directory}"
         + (" (training and validation parts)" if len(parts) > 1 else ""))
    with progress(walked) as walk:
        for label, index, reader, key in walk:
            _check(label, key, index, reader, summary, tf, FEATURES)
    summary.seconds = time.perf_counter() - began
    for line in summary.bad:
        echo(f"bad record: {line}")
    echo(f"{plural(summary.records, 'record')} checked in {summary.seconds:.1f} s: "
         + (f"{len(summary.bad)} bad" if summary.bad else "all good"))
    return summary


def _check(label, key, index, reader, summary, tf, features) -> None:
    problem = index.known_reason(key) or reader.damage(key)
    if problem is None:
        try:
            tf.io.parse_single_example(reader.read(key), features)
        except tf.errors.OpError:
            number, offset, _ = index.locations[key]
            problem = f"its record in {index.files[number]} at byte {offset:,} is not a packed Example"
    if problem is not None:
        summary.bad.append(f"{label}{key}: {problem}")
    summary.records += 1
