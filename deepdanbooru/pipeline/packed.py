"""Shards in and out of the graph: the picture fitted to the training box as JPEG bytes, and reading it back.

Training visits records in a seeded permutation, so a slice needs random
access into the shards; TensorFlow's record datasets only read forwards (an
offset is skipped by reading up to it: 7-10 ms a record in 150 MB files), so
each record is read at the offset in the index by TensorFlow's random-access
record reader, which checks the record's CRCs, then parsed in the graph. The picture is then decoded and warped
by OpenCV (picturewarp.py), with the maps an original file's picture gets from the XLA warp.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from deepdanbooru.compat import checked_record_reader
from deepdanbooru.pipeline.decode import decode_for_box
from deepdanbooru.pipeline.fill import Fill
from deepdanbooru.pipeline.transform import fit_into_box

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "labels": tf.io.VarLenFeature(tf.int64),
    "key": tf.io.FixedLenFeature([], tf.string),
}


# TFRecord framing: the record's 8-byte length and that length's 4-byte CRC come before its bytes.
FRAMING_HEAD = 12


class ShardReader:
    """Example bytes by image path, each checked against its TFRecord CRCs; b"" for a picture not in the shards.

    A record whose bytes no longer match their checksum (a flipped bit on disk or in a copy) raises
    tf.errors.DataLossError, so the pipeline drops it like an undecodable file and diagnose() names it.
    Each thread keeps its own file readers: tf.data calls read() from several threads at once.
    """

    def __init__(self, index):
        self.index = index
        self._local = threading.local()

    def _reader(self, number: int):
        readers = self._local.__dict__.setdefault("readers", {})
        if number not in readers:
            readers[number] = checked_record_reader(self.index.files[number])
        return readers[number]

    def read(self, path) -> bytes:
        if isinstance(path, (bytes, np.bytes_)):
            path = path.decode("utf-8")
        location = self.index.locations.get(path)
        if location is None or self.index.known_reason(path):
            return b""
        number, offset, length = location
        record, _ = self._reader(number).read(offset - FRAMING_HEAD)
        if len(record) != length:
            raise tf.errors.DataLossError(None, None, f"record length {len(record)}, the index says {length}")
        return record

    def damage(self, path) -> str | None:
        """Why the record of `path` cannot be read from its shard (damaged, cut short), or None when it can."""
        try:
            self.read(path)
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError, OSError) as error:
            number, offset, _ = self.index.locations[str(path)]
            what = "fails its checksum" if isinstance(error, tf.errors.DataLossError) else "cannot be read"
            return (f"cannot be decoded: its record in {self.index.files[number]} at byte {offset - FRAMING_HEAD:,} "
                    f"{what} (damaged on disk); delete that shard and run `{self.index.rebuild}` to pack it again")
        return None

    def diagnose(self, path, max_image_pixels) -> str:
        from deepdanbooru.pipeline.badimages import UNEXPLAINED, diagnose_bytes

        path = str(path)
        known = self.index.known_reason(path) or self.damage(path)
        if known:
            return known
        try:
            image = tf.io.parse_single_example(self.read(path), FEATURES)["image"].numpy()
        except tf.errors.OpError:
            return f"cannot be decoded: its record in {self.index.directory} is damaged; `{self.index.rebuild}`"
        return diagnose_bytes(image, max_image_pixels) or UNEXPLAINED

    def jpeg(self, path):
        """In the graph: the JPEG bytes of the packed picture of the record at `path` (picturewarp decodes them)."""
        data = tf.numpy_function(self.read, [path], tf.string, stateful=False)
        return tf.io.parse_single_example(tf.ensure_shape(data, []), FEATURES)["image"]


@dataclass
class ScoringInput:
    """Unaugmented, labelled batches of the project's pictures, and how to explain the ones that drop out."""

    dataset: object  # tf.data.Dataset of inference_dataset's dicts
    paths: list  # paths[position]
    diagnose: object  # (path, max_image_pixels) -> reason, for BadImageTracker(diagnose_path=)
    source: str  # where the pictures come from: the shards folder or "original files"
    notice: str | None  # why packed pictures are not used although the project has shards


def scoring_input(root, config, records, tags, *, height=None, width=None, batch_size=None) -> ScoringInput:
    """The project's pictures of `records` (its validation split, usually) as scoring reads them.

    From the shard set's validation part when it holds every one of them fitted at (height, width) (default:
    the project's image size), else from the original files, with `notice` saying why. Validation during
    training and evaluate-project read through here; so should every command that scores the project's own
    pictures. The pictures read from shards differ from the originals' only by the JPEG re-encoding.
    """
    from deepdanbooru.pipeline.badimages import diagnose
    from deepdanbooru.pipeline.dataset import inference_dataset
    from deepdanbooru.pipeline.fill import Fill
    from deepdanbooru.project.shards import scoring_shards

    height, width = height or config.image_height, width or config.image_width
    index, notice = scoring_shards(root, config, records, (height, width))
    reader = ShardReader(index) if index is not None else None
    paths = records.paths()
    dataset = inference_dataset(paths, height=height, width=width, batch_size=batch_size or config.minibatch_size,
                                max_image_pixels=config.max_image_pixels, tag_strings=list(records.tag_strings),
                                tags=list(tags), fill=Fill.from_config(config), shards=reader)
    return ScoringInput(dataset, paths, reader.diagnose if reader else diagnose,
                        str(index.directory) if index else "original files", notice)


@functools.lru_cache(maxsize=8)
def fit_function(box, max_image_pixels, alpha="drop", quality=95):
    """path -> JPEG bytes (at `quality`) of the picture area-resized into `box` as training fits it (never enlarged).

    Transparency is settled here (`alpha`, as project.json says), since a JPEG keeps none; padding is not:
    the shards hold the unpadded picture, and training's warp pads it as project.json says then.
    """
    fill = Fill(alpha=alpha)
    box = (float(box[0]), float(box[1]))
    canvas = (int(np.ceil(box[0])), int(np.ceil(box[1])))

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([], tf.string)])
    def fit(path):
        image, source = decode_for_box(tf.io.read_file(path), max_image_pixels, box, fill=fill)
        content, _, _ = fit_into_box(image, source, box, canvas)
        return tf.io.encode_jpeg(content, quality=quality, chroma_downsampling=True)

    return fit


def example_bytes(image: bytes, labels, key: str) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
        "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[key.encode("utf-8")])),
    }
    # deterministic: the features are a map, serialized in an order that otherwise changes per process.
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)

