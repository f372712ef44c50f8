"""Shards in and out of the graph: the picture fitted to the training box as JPEG bytes, and reading it back.

Training visits records in a seeded permutation, so a slice needs random
access into the shards; TensorFlow's record readers only read forwards (an
offset is skipped by reading up to it: 7-10 ms a record in 150 MB files), so
the Example bytes are sliced from memory-mapped shards by the offsets in the
index, then parsed in the graph. The picture then takes the same fit and warp
ops as an original file.
"""

from __future__ import annotations

import functools
import mmap

import numpy as np
import tensorflow as tf

from deepdanbooru.pipeline.decode import decode_for_box
from deepdanbooru.pipeline.fill import Fill
from deepdanbooru.pipeline.transform import fit_into_box
from deepdanbooru.project.shards import JPEG_QUALITY

FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "labels": tf.io.VarLenFeature(tf.int64),
    "key": tf.io.FixedLenFeature([], tf.string),
}


class ShardReader:
    """Example bytes by image path, from memory-mapped shards; b"" for a picture the shards do not hold."""

    def __init__(self, index):
        self.index = index
        self._maps = []
        for path in index.files:
            try:
                with open(path, "rb") as handle:
                    self._maps.append(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                                      if handle.seek(0, 2) else b"")
            except FileNotFoundError:
                self._maps.append(b"")

    def read(self, path) -> bytes:
        if isinstance(path, (bytes, np.bytes_)):
            path = path.decode("utf-8")
        location = self.index.locations.get(path)
        if location is None:
            return b""
        number, offset, length = location
        data = self._maps[number][offset:offset + length]
        return bytes(data) if len(data) == length else b""

    def diagnose(self, path, max_image_pixels) -> str:
        from deepdanbooru.pipeline.badimages import UNEXPLAINED, diagnose_bytes

        path = str(path)
        known = self.index.known_reason(path)
        if known:
            return known
        try:
            image = tf.io.parse_single_example(self.read(path), FEATURES)["image"].numpy()
        except tf.errors.OpError:
            return f"cannot be decoded: its record in {self.index.directory} is damaged; `{self.index.rebuild}`"
        return diagnose_bytes(image, max_image_pixels) or UNEXPLAINED

    def picture(self, path):
        """In the graph: (uint8 [h, w, 3], int64 [h, w]) of the packed picture of the record at `path`.

        What decode_for_box gives for the same bytes, without its format routing and size checks: the
        shards hold baseline JPEGs that pack wrote and that fit the box, and the routing cost more than
        the decoding (2.2 against 0.9 CPU-ms a picture at 448).
        """
        data = tf.numpy_function(self.read, [path], tf.string, stateful=False)
        data = tf.io.parse_single_example(tf.ensure_shape(data, []), FEATURES)["image"]
        image = tf.io.decode_jpeg(data, channels=3)
        return image, tf.shape(image, out_type=tf.int64)[:2]


@functools.lru_cache(maxsize=8)
def fit_function(box, max_image_pixels, alpha="drop"):
    """path -> JPEG bytes of the picture area-resized into `box` the way training fits it (never enlarged).

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
        return tf.io.encode_jpeg(content, quality=JPEG_QUALITY, chroma_downsampling=True)

    return fit


def example_bytes(image: bytes, labels, key: str) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
        "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[key.encode("utf-8")])),
    }
    # deterministic: the features are a map, serialized in an order that otherwise changes per process.
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)

