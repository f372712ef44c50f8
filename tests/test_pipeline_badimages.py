"""No silent drops: every unusable record is left out of its batch, counted and named with a reason."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from deepdanbooru.pipeline import (  # noqa: E402
    Augmentation, BadImageTracker, TrainingInput, decode_image_bytes, diagnose, inference_dataset, training_dataset,
)
from deepdanbooru.pipeline import badimages  # noqa: E402

LIMIT = 10**6


def _encoded(fmt, size=(40, 48), seed=0):
    array = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def _png_header_only(width, height):
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
            + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))


# name -> (bytes or None for a missing file, expected reason prefix or None for a good image)
RECORDS = {
    "good_0.jpg": (_encoded("JPEG", seed=1), None),
    "zero_bytes.jpg": (b"", badimages.EMPTY),
    "truncated.jpg": (_encoded("JPEG", seed=2)[:700], badimages.TRUNCATED),
    "good_1.png": (_encoded("PNG", seed=3), None),
    "truncated.png": (_encoded("PNG", seed=4)[:2000], badimages.TRUNCATED),
    "not_an_image.jpg": (b"<html>404 not found</html>\n", badimages.NOT_AN_IMAGE),
    "missing.jpg": (None, badimages.MISSING),
    "oversized.png": (_png_header_only(60000, 60000), badimages.OVERSIZED),
    "good_2.webp": (_encoded("WEBP", seed=5), None),
    "corrupt_body.png": (None, badimages.UNDECODABLE),  # filled in below
}


def _corrupt_png():
    # Complete container (IEND present) whose compressed pixel data is garbage.
    data = bytearray(_encoded("PNG", seed=6))
    start = data.index(b"IDAT") + 4
    data[start:start + 64] = bytes(range(64))
    return bytes(data)


RECORDS["corrupt_body.png"] = (_corrupt_png(), badimages.UNDECODABLE)


@pytest.fixture()
def records(tmp_path):
    paths, expected = [], []
    for name, (data, reason) in RECORDS.items():
        path = tmp_path / "images" / name
        if data is not None:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
        paths.append(str(path))
        expected.append(reason)
    return paths, expected


def test_each_bad_kind_is_diagnosed(records):
    paths, expected = records
    for path, reason in zip(paths, expected):
        found = diagnose(path, LIMIT)
        if reason is None:
            assert found == badimages.UNEXPLAINED, path  # decodes fine when re-read
        else:
            assert found.startswith(reason), (path, found)
    assert "60000x60000" in diagnose(paths[7], LIMIT)


def test_a_jpeg_cut_inside_its_header_is_truncated_and_reasons_carry_no_op_names(tmp_path):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(_encoded("JPEG", seed=7)[:300])  # ends in the quantization tables, before the frame header
    assert diagnose(str(cut), LIMIT) == "truncated: jpeg of 300 bytes ends early"
    broken = bytearray(_encoded("JPEG", seed=8))
    broken[2:6] = b"\xff\xc0\x00\x02"  # a frame header of no length, the end marker still there
    (tmp_path / "broken.jpg").write_bytes(bytes(broken))
    reason = diagnose(str(tmp_path / "broken.jpg"), LIMIT)
    assert reason.startswith("cannot be decoded: corrupt JPEG header: ") and "[Op:" not in reason and "name:" not in reason


def test_a_jpeg_cut_before_its_scan_is_diagnosed_without_asking_libjpeg(capfd):
    """libjpeg, asked for the header of such a file, writes "Improper call to JPEG library" straight to stderr:
    once when the pipeline drops the picture (TensorFlow's own op), not a second time for its reason."""
    whole = _encoded("JPEG", seed=9)
    buffer = io.BytesIO()  # the scan starts past the first 40,000 bytes, after a large colour profile
    Image.open(io.BytesIO(whole)).save(buffer, format="JPEG", icc_profile=bytes(40_000))
    late = buffer.getvalue()
    assert late.index(b"\xff\xda") > 40_000
    assert badimages.diagnose_bytes(late, LIMIT) is None
    for data, cut in [(whole, 20), (whole, 120), (whole, whole.index(b"\xff\xda")), (late, 30_000)]:
        with pytest.raises(tf.errors.InvalidArgumentError):
            decode_image_bytes(data[:cut], LIMIT)
        capfd.readouterr()
        assert badimages.diagnose_bytes(data[:cut], LIMIT) == f"truncated: jpeg of {cut:,} bytes ends early"
        assert "JPEG library" not in capfd.readouterr().err
    no_scan = whole[:whole.index(b"\xff\xda")] + b"\xff\xd9"
    assert badimages.diagnose_bytes(no_scan, LIMIT) == \
        "cannot be decoded: jpeg holds no image data (no start-of-scan marker)"
    # Cut after the start of scan: the header is read; the scan's missing rows fail the decode.
    cut = whole[:len(whole) // 2]
    assert badimages.diagnose_bytes(cut, LIMIT) == f"truncated: jpeg of {len(cut):,} bytes ends early"


def test_training_excludes_counts_and_logs_every_bad_record(records, tmp_path):
    paths, expected = records
    start = 500
    epoch_paths = {start + i: path for i, path in enumerate(paths)}
    dataset = training_dataset(paths, ["a"] * len(paths), ["a"],
                               TrainingInput(16, 16, Augmentation((0, 360), (0.9, 1.1), (-0.1, 0.1)),
                                             seed=0, batch_size=2, max_image_pixels=LIMIT),
                               random_seed=0, start_position=start)
    log = tmp_path / "project" / "logs" / "bad_images.txt"
    tracker = BadImageTracker(log, epoch_paths, max_image_pixels=LIMIT, context="epoch 3")
    sizes = []
    for batch in dataset:
        tracker.observe(batch["position"].numpy())
        sizes.append(int(batch["image"].shape[0]))
    good = [start + i for i, reason in enumerate(expected) if reason is None]
    assert sizes == [2, 1]  # batches refill past the dropped records
    bad_count = tracker.finish(start, len(paths))
    assert bad_count == len(paths) - len(good) == 7
    assert (tracker.seen, tracker.bad, tracker.used) == (len(paths), 7, 3)
    assert tracker.bad_fraction == pytest.approx(0.7)
    assert sum(tracker.reasons.values()) == 7 and tracker.reasons[badimages.TRUNCATED] == 2

    lines = log.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 7
    logged = {}
    for line in lines:
        context, position, path, reason = line.split("\t")
        assert context == "epoch 3"
        logged[int(position)] = (path, reason)
    for i, reason in enumerate(expected):
        if reason is None:
            assert start + i not in logged
        else:
            assert logged[start + i][0] == paths[i]
            assert logged[start + i][1].startswith(reason)
    assert [p for p, _, _ in tracker.last_bad] == sorted(logged)


def test_log_is_appended_across_slices_and_a_clean_slice_writes_nothing(records, tmp_path):
    paths, expected = records
    log = tmp_path / "bad_images.txt"
    tracker = BadImageTracker(log, paths, max_image_pixels=LIMIT)
    for first, last in ((0, 3), (3, len(paths))):
        dataset = inference_dataset(paths[first:last], height=16, width=16, batch_size=4, max_image_pixels=LIMIT)
        for batch in dataset:
            tracker.observe(batch["position"].numpy() + first)
        tracker.finish(first, last - first)
    assert len(log.read_text().splitlines()) == 7
    assert all(line.startswith("-\t") for line in log.read_text().splitlines())

    # The same range again (a slice re-run after a resume) adds nothing; another context adds its lines.
    before = log.read_text()
    log.write_text(before + "-\t9\tcut short by a kill")  # no newline at the end
    dataset = inference_dataset(paths, height=16, width=16, batch_size=4, max_image_pixels=LIMIT)
    for batch in dataset:
        tracker.observe(batch["position"].numpy())
    assert tracker.finish(0, len(paths)) == 7
    assert log.read_text() == before + "-\t9\tcut short by a kill"
    again = BadImageTracker(log, paths, max_image_pixels=LIMIT, context="epoch 2")
    assert again.finish(0, len(paths)) == len(paths)
    lines = log.read_text().splitlines()
    assert lines[:8] == [*before.splitlines(), "-\t9\tcut short by a kill"]
    assert len(lines) == 8 + len(paths) and all(line.startswith("epoch 2\t") for line in lines[8:])

    clean = BadImageTracker(tmp_path / "clean" / "bad_images.txt", [paths[0]], max_image_pixels=LIMIT)
    for batch in inference_dataset([paths[0]], height=16, width=16, batch_size=4, max_image_pixels=LIMIT):
        clean.observe(batch["position"].numpy())
    assert clean.finish(0, 1) == 0 and not (tmp_path / "clean").exists()


def test_a_slice_of_only_bad_records_yields_no_batch_and_all_are_counted(tmp_path):
    paths = [str(tmp_path / f"missing_{i}.jpg") for i in range(4)]
    dataset = training_dataset(paths, [""] * 4, ["a"],
                               TrainingInput(16, 16, Augmentation(None, None, None),
                                             seed=0, batch_size=2, max_image_pixels=LIMIT),
                               random_seed=0, start_position=0)
    assert list(dataset) == []
    tracker = BadImageTracker(tmp_path / "bad.txt", paths, max_image_pixels=LIMIT)
    assert tracker.finish(0, 4) == 4 and tracker.bad_fraction == 1.0
    assert all(line.endswith(badimages.MISSING) for line in (tmp_path / "bad.txt").read_text().splitlines())
