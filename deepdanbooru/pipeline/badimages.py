"""No silent drops: find the records the pipeline dropped, say why, count them and log them.

The datasets drop failing records with `ignore_errors()` (TensorFlow cannot
catch a decode error inside the graph) but every element carries its position,
so the missing positions are exactly the dropped records. Each is then re-read
here, in Python, and diagnosed with the same header parser and decoder the
pipeline uses, run eagerly.
"""

from __future__ import annotations

import collections
import os
import struct
from pathlib import Path

import numpy as np
import tensorflow as tf

from deepdanbooru.errors import tf_message_text
from deepdanbooru.pipeline.decode import decode_image_bytes
from deepdanbooru.pipeline.gaps import PositionGaps
from deepdanbooru.pipeline.header import FORMAT_NAMES, JPEG, UNKNOWN, declared_pixels, image_header

# Reasons, as written in the third column of bad_images.txt (the details follow a colon).
MISSING = "file not found"
UNREADABLE = "cannot be read"
EMPTY = "empty file (0 bytes)"
NOT_AN_IMAGE = "not an image (unrecognised file signature)"
OVERSIZED = "oversized"
TRUNCATED = "truncated"
UNDECODABLE = "cannot be decoded"
UNEXPLAINED = "dropped by the pipeline but decodes when re-read (transient read error?)"


def _tf_message(error: Exception) -> str:
    return tf_message_text(error)[:200]


def _looks_truncated(image_format: int, data: bytes) -> bool:
    """True when the container's own length or end marker says bytes are missing."""
    name = FORMAT_NAMES[image_format]
    tail = data[-4096:]
    if name == "jpeg":
        return b"\xff\xd9" not in tail
    if name == "png":
        return b"IEND" not in tail
    if name == "gif":
        return not data.rstrip(b"\0").endswith(b"\x3b")
    if name == "webp" and len(data) >= 8:
        return struct.unpack("<I", data[4:8])[0] + 8 > len(data)
    if name == "bmp" and len(data) >= 6:
        return struct.unpack("<I", data[2:6])[0] > len(data)
    return False


_JPEG_SIGNATURE, _START_OF_SCAN = b"\xff\xd8\xff", b"\xff\xda"


def _ends_early(name: str, data: bytes) -> str:
    return f"{TRUNCATED}: {name} of {len(data):,} bytes ends early"


def diagnose_bytes(data: bytes, max_image_pixels: int) -> str | None:
    """Why the pipeline cannot use these bytes, or None when they decode."""
    if not data:
        return EMPTY
    if data.startswith(_JPEG_SIGNATURE) and _START_OF_SCAN not in data:
        # Cut off inside its header: libjpeg, asked, would also print "Improper call to JPEG library" on stderr.
        return _ends_early("jpeg", data) if _looks_truncated(JPEG, data) else \
            f"{UNDECODABLE}: jpeg holds no image data (no start-of-scan marker)"
    tensor = tf.constant(data)
    try:
        image_format, size = image_header(tensor)
    except tf.errors.OpError as error:
        if _looks_truncated(JPEG, data):  # only a JPEG's header is read by an op that can fail
            return _ends_early("jpeg", data)
        return f"{UNDECODABLE}: corrupt JPEG header: {_tf_message(error)}"
    image_format = int(image_format)
    if image_format == UNKNOWN:
        return NOT_AN_IMAGE
    height, width, frames = (int(v) for v in size.numpy())
    name = FORMAT_NAMES[image_format]
    pixels = int(declared_pixels(size))
    if height <= 0 or width <= 0:
        if _looks_truncated(image_format, data):
            return _ends_early(name, data)
        return f"{UNDECODABLE}: {name} header declares no size"
    if pixels > max_image_pixels:
        frames_note = f" x {frames} frames" if frames > 1 else ""
        return (f"{OVERSIZED}: {name} declares {width}x{height}{frames_note} = {pixels:,} pixels, "
                f"over max_image_pixels {max_image_pixels:,}")
    try:
        decode_image_bytes(tensor, max_image_pixels)
    except tf.errors.OpError as error:
        if _looks_truncated(image_format, data):
            return _ends_early(name, data)
        return f"{UNDECODABLE}: {name}: {_tf_message(error)}"
    return None


def diagnose(path, max_image_pixels: int) -> str:
    """Why the pipeline dropped the image at `path` (never None: re-reading may also succeed)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return MISSING
    except IsADirectoryError:
        return f"{UNREADABLE}: is a directory"
    except OSError as error:
        return f"{UNREADABLE}: {error.strerror or error}"
    return diagnose_bytes(data, max_image_pixels) or UNEXPLAINED


class BadImageTracker:
    """Accounts for every record of a run of datasets: seen, used, bad (with reasons), and logs the bad ones.

    `paths[position]` must be the path of the record at that position (for
    training: the epoch order; for inference: the list given to the dataset).
    Lines appended to `log_path`: `<context>\\t<position>\\t<path>\\t<reason>`.
    """

    def __init__(self, log_path, paths, *, max_image_pixels: int, context: str = "-", diagnose_path=None):
        self.log_path = Path(log_path)
        # diagnose_path(path, max_image_pixels) -> reason: packed shards know why a picture is not in them.
        self._diagnose = diagnose_path or diagnose
        self.paths = paths
        self.max_image_pixels = max_image_pixels
        self.context = context or "-"
        self.seen = 0  # records accounted for by finish()
        self.bad = 0
        self.reasons: collections.Counter[str] = collections.Counter()
        self.last_bad: list[tuple[int, str, str]] = []  # (position, path, reason) of the latest finish()
        self._gaps = PositionGaps()

    @property
    def used(self) -> int:
        return self.seen - self.bad

    @property
    def bad_fraction(self) -> float:
        return self.bad / self.seen if self.seen else 0.0

    def observe(self, positions) -> None:
        """Positions (int64) of the records in one batch that came out of the dataset."""
        self._gaps.observe(positions)

    def finish(self, start_position: int, count: int) -> int:
        """Close the range [start_position, start_position + count): diagnose and log its gaps; return their number."""
        missing = self._gaps.missing(np.arange(start_position, start_position + count, dtype=np.int64))
        self.last_bad = []
        for position in missing.tolist():
            path = str(self.paths[position])
            reason = self._diagnose(path, self.max_image_pixels)
            self.last_bad.append((position, path, reason))
            self.reasons[reason.split(":", 1)[0]] += 1
        self.seen += count
        self.bad += len(missing)
        if self.last_bad:
            self._append(self.last_bad)
        return len(missing)

    def _append(self, entries) -> None:
        """Append the lines the log does not hold yet.

        A slice re-run after a resume (or a validation pass repeated) finds the same images under the
        same context and position; they are listed once. A line cut short by a kill is closed first.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{self.context}\t{position}\t{_one_line(path)}\t{_one_line(reason)}"
                 for position, path, reason in entries]
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            text = ""
        known = set(text.splitlines())
        new = [line for line in dict.fromkeys(lines) if line not in known]
        if not new:
            return
        with open(self.log_path, "a", encoding="utf-8") as log:
            if text and not text.endswith("\n"):
                log.write("\n")
            log.write("".join(f"{line}\n" for line in new))
            log.flush()
            os.fsync(log.fileno())


def _one_line(text: str) -> str:
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
