"""deepdanbooru pack: shards that give training the same records in the same order, refused when stale."""

from __future__ import annotations

import errno
import json
import re
import shutil
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru import exitcodes
from deepdanbooru.cli import main
from deepdanbooru.errors import ConfigError, DatasetError, Interrupted, TrainingError
from deepdanbooru.packing import pack as packing
from deepdanbooru.packing.pack import pack_project
from deepdanbooru.preflight.main import training_preflight
from deepdanbooru.training.train import plan_training
from train_helpers import assert_same_weights, make_project, read_state, set_config

QUIET = dict(echo=lambda *_: None)


def preflight(project) -> dict:
    """{check name: (status, detail)} of `deepdanbooru preflight PROJECT --max-image-checks 0`."""
    return {r.name: (r.status, r.detail) for r in training_preflight(project, max_image_checks=0)}


def failed(results) -> list[str]:
    return [name for name, (status, _) in results.items() if status == "FAIL"]


def _copy_dataset(sample_dataset, directory):
    database, tags = sample_dataset
    shutil.copytree(database.parent, directory)
    return directory / database.name, tags


def _pack_once(directory, sample_dataset, **overrides):
    """(directory, summary, lines) of a tiny project over its own copy of the sample dataset, packed into shards
    of up to 10 pictures: directory/dataset, directory/project."""
    database, tags = _copy_dataset(sample_dataset, directory / "dataset")
    project = make_project(directory / "project", database, tags, **overrides)
    lines = []
    summary = pack_project(project, echo=lines.append, shard_records=10)
    return directory, summary, lines


def _copy_packed(once, target):
    """A copy at target of a _pack_once project, its dataset and its shards, as if packed there: a project
    copied with its shards keeps them; the manifest and the lines name the copy's project and database as
    packing them there writes them. Tests modify their copy; the original stays as packed."""
    source, summary, lines = once
    shutil.copytree(source / "dataset", target / "dataset")
    shutil.copytree(source / "project", target / "project")
    project = target / "project"
    config = json.loads((project / "project.json").read_text())
    config["database_path"] = config["database_path"].replace(str(source), str(target))
    (project / "project.json").write_text(json.dumps(config, indent=2))
    manifest = project / "shards" / "manifest.json"
    made_from = json.loads(manifest.read_text())["made_from"]
    text = manifest.read_text()
    for key, value in (("project", str(project.resolve())),
                       ("database", made_from["database"].replace(str(source), str(target)))):
        text = text.replace(json.dumps(made_from[key]), json.dumps(value))
    manifest.write_text(text)
    assert json.loads(manifest.read_text())["made_from"]["project"] == str(project.resolve())
    return project, summary, [line.replace(str(source), str(target)) for line in lines]


@pytest.fixture(scope="module")
def packed_once(tmp_path_factory, sample_dataset):
    return _pack_once(tmp_path_factory.mktemp("packed"), sample_dataset)


@pytest.fixture
def packed(tmp_path, packed_once):
    """A tiny project over its own copy of the sample dataset, packed into 3 shards of up to 10 pictures
    (packed once per module, copied for each test)."""
    return _copy_packed(packed_once, tmp_path)


def _datasets(project, shards: bool):
    from deepdanbooru.pipeline import TrainingInput, training_dataset
    from deepdanbooru.training.data import shard_reader

    plan = plan_training(project)
    reader = shard_reader(plan.shards) if shards else None
    batches = training_dataset(plan.train.paths(), plan.train.tag_strings, plan.tags,
                               TrainingInput.from_config(plan.config), random_seed=7, start_position=0,
                               shards=reader)
    return plan, reader, list(batches.as_numpy_iterator())


def test_shards_give_the_same_records_labels_and_order_as_the_files(packed):
    project, summary, lines = packed
    assert (summary.pictures, summary.bad, summary.shards, summary.packed_now) == (24, 0, 3, 3)
    names = sorted(p.name for p in (project / "shards").iterdir())
    assert names == ["manifest.json", "plan.json"] + [f"shard-0000{n}.{ext}" for n in range(3)
                                                      for ext in ("json", "tfrecord")]
    assert lines[0].startswith("Packing 24 pictures from ") and "into 3 shards" in lines[0]
    assert [line.split(":")[0].strip() for line in lines[1:4]] == ["shard 1/3", "shard 2/3", "shard 3/3"]
    assert lines[-1].startswith("Packed 24 pictures into 3 shards")
    manifest = json.loads((project / "shards" / "manifest.json").read_text())
    assert manifest["made_from"]["box"] == [35, 35]  # 32 x the default scale_range's 1.1, rounded down
    assert manifest["made_from"]["alpha"] == "drop"

    _, _, files = _datasets(project, shards=False)
    plan, reader, shards = _datasets(project, shards=True)
    assert plan.shards is not None and plan.shards.warnings() == []
    assert len(files) == len(shards) == 6
    for a, b in zip(files, shards):
        np.testing.assert_array_equal(a["position"], b["position"])
        np.testing.assert_array_equal(a["label"], b["label"])
        # Re-encoded as JPEG at the box size: close to, not equal to, the pictures decoded from the originals.
        assert np.abs(a["image"] - b["image"]).mean() < 0.02

    # The shards are plain TFRecord files of Examples whose label indices are the tags.txt columns.
    import tensorflow as tf

    from deepdanbooru.pipeline.packed import FEATURES

    labels = {}
    for record in tf.data.TFRecordDataset(sorted(map(str, (project / "shards").glob("*.tfrecord")))):
        example = tf.io.parse_single_example(record, FEATURES)
        labels[example["key"].numpy().decode()] = sorted(tf.sparse.to_dense(example["labels"]).numpy().tolist())
    images = plan.train.images_dir
    for path, tag_string in zip(plan.train.paths(), plan.train.tag_strings):
        key = path[len(str(images)) + 1:]
        assert labels[key] == sorted(plan.tags.index(tag) for tag in tag_string.split() if tag in plan.tags)

    # Packing again finds nothing to do.
    again = []
    assert pack_project(project, echo=again.append, shard_records=10).packed_now == 0
    assert again == [f"{project / 'shards'}: up to date (24 pictures in 3 shards)"]


@pytest.mark.parametrize("change, message", [
    (lambda project: set_config(project, image_width=40, image_height=40),
     r"were packed for image_height x image_width \[32, 32\], project.json now says \[40, 40\]"),
    (lambda project: set_config(project, scale_range=[0.9, 1.5]),
     r"were packed into a \[35, 35\] box, the augmentation's scale/crop now needs \[48, 48\]"),
    (lambda project: (project / "tags.txt").write_text((project / "tags.txt").read_text() + "new_tag\n"),
     r"were labelled with another tags.txt"),
    (lambda project: _retag_first_post(project), r"were made from other database records \(24 then, 24 now"),
    (lambda project: set_config(project, minimum_tag_count=6), r"were made from other database records \(24 then, 7 now"),
    (lambda project: set_config(project, alpha="white"), r"were packed with alpha drop .*project.json now says white"),
    (lambda project: set_config(project, pack_quality=80),
     r"were stored as jpeg quality 95 4:2:0, project.json's pack_quality now asks for jpeg quality 80 4:2:0"),
])
def test_stale_shards_are_refused_by_name_with_the_command_that_rebuilds_them(packed, change, message):
    project, _, _ = packed
    change(project)
    with pytest.raises(TrainingError, match=message) as raised:
        plan_training(project)
    text = str(raised.value)
    assert text.startswith(f"{project / 'shards' / 'manifest.json'}: stale shards: they ")
    assert text.endswith(f"rebuild them with `deepdanbooru pack {project}`")
    # The command line: one line, the usage exit code, and nothing written into the project.
    result = CliRunner().invoke(main, ["train-project", str(project)])
    assert result.exit_code == exitcodes.USAGE
    assert result.output.strip().splitlines() == [f"error: {text}"]
    assert not (project / "checkpoints").exists()
    # Preflight says what train-project will do, in its words.
    results = preflight(project)
    assert failed(results) == ["shards"] and results["shards"][1] == text
    # Packing again makes them current.
    summary = pack_project(project, shard_records=10, **QUIET)
    assert summary.packed_now == summary.shards and plan_training(project).shards is not None


def test_pack_quality_is_the_quality_the_pictures_are_stored_at(packed):
    """A lower pack_quality stores smaller pictures that still give the records the originals give."""
    project, summary, _ = packed
    set_config(project, pack_quality=60)
    again = pack_project(project, shard_records=10, **QUIET)
    assert again.packed_now == again.shards and again.pictures == summary.pictures
    assert again.bytes < 0.8 * summary.bytes
    manifest = json.loads((project / "shards" / "manifest.json").read_text())
    assert manifest["made_from"]["encoding"] == "jpeg quality 60 4:2:0"
    _, _, files = _datasets(project, shards=False)
    _, _, shards = _datasets(project, shards=True)
    for a, b in zip(files, shards, strict=True):
        np.testing.assert_array_equal(a["label"], b["label"])
        assert np.abs(a["image"] - b["image"]).mean() < 0.03


def _retag_first_post(project):
    database = json.loads((project / "project.json").read_text())["database_path"]
    with sqlite3.connect(database) as connection:
        (post_id, tags), = connection.execute("SELECT id, tag_string FROM posts ORDER BY id LIMIT 1")
        connection.execute("UPDATE posts SET tag_string = ? WHERE id = ?", (" ".join(tags.split()[:-1]), post_id))


def test_shards_are_not_sent_to_data_service_workers(packed):
    project, _, _ = packed
    set_config(project, data_service="localhost:5050")
    with pytest.raises(ConfigError, match=r"project.json: data_service: cannot serve the packed shards in .*shards; "
                                          r"set data_service to null") as raised:
        plan_training(project)
    results = preflight(project)
    assert failed(results) == ["shards"] and results["shards"][1] == str(raised.value)


def test_preflight_passes_a_project_training_from_shards_without_its_originals(packed):
    """Once packed, training reads no original file (without validation): preflight must not ask for them."""
    project, _, _ = packed
    images = json.loads((project / "project.json").read_text())["database_path"].replace("dataset.sqlite", "images")
    shutil.rmtree(images)
    results = preflight(project)
    assert failed(results) == [], results
    assert results["shards"] == ("PASS", f"train-project will read the training pictures from {project / 'shards'} "
                                         "(24 packed in 3 shard(s), 0 could not be packed); validation reads the "
                                         "original files")
    assert results["images"] == ("PASS", f"checked all 24 eligible images: 24 picture(s) packed in "
                                         f"{project / 'shards'} (train-project reads them from there, not from the "
                                         "original files)")
    # And train-project does: every record comes from the shards, none is dropped.
    plan, _, batches = _datasets(project, shards=True)
    assert sorted(np.concatenate([batch["position"] for batch in batches]).tolist()) == list(range(24))

    # Validation still reads the original files: with a split, their absence fails as without shards (and
    # train-project stops at the first validation: none of the validation images could be read).
    set_config(project, validation_fraction=0.3)  # the shards hold every eligible post: still current
    results = preflight(project)
    assert failed(results) == ["images"]
    assert results["shards"][0] == "PASS"
    plan = plan_training(project)
    assert plan.shards is not None and len(plan.validation)
    first = plan.validation.paths()[0]
    assert f"{first}: file not found (a validation post: validation reads its original file)" in results["images"][1]
    assert f"{len(plan.validation)} unusable among all 24 eligible images" in results["images"][1]


def test_preflight_fails_a_picture_packing_could_not_read(packed):
    project, _, _ = packed
    index_path = project / "shards" / "shard-00000.json"
    index = json.loads(index_path.read_text())
    key, _, _ = index["records"].pop(0)
    index["bad"].append([key, "cannot be decoded: test"])
    index_path.write_text(json.dumps(index))
    results = preflight(project)
    assert failed(results) == ["images"]
    assert results["images"][1].startswith("1 unusable among all 24 eligible images: id ")
    assert results["images"][1].endswith(f"/images/{key}: cannot be decoded: test")


def test_shards_of_another_project_are_refused_naming_it(packed, tmp_path, sample_dataset):
    project, _, _ = packed
    database, tags = _copy_dataset(sample_dataset, tmp_path / "other_dataset")
    other = make_project(tmp_path / "other", database, tags[:-1])
    shutil.copytree(project / "shards", other / "shards")
    with pytest.raises(TrainingError, match=rf"stale shards \(packed when the project was at {project}\): they were "
                                            r"labelled with another tags.txt"):
        plan_training(other)
    # A project moved (or copied) with its shards keeps them: they were made from the same things.
    moved = tmp_path / "moved"
    shutil.copytree(project, moved)
    assert plan_training(moved).shards is not None
    assert pack_project(moved, shard_records=10, **QUIET).packed_now == 0


def test_truncated_shard_is_named_and_the_others_still_used(packed):
    project, _, _ = packed
    shard = project / "shards" / "shard-00001.tfrecord"
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    from deepdanbooru.pipeline import BadImageTracker

    plan, reader, batches = _datasets(project, shards=True)
    (warning,) = plan.shards.warnings()
    assert warning.startswith(f"{shard}: truncated (") and f"`deepdanbooru pack {project}` repairs it" in warning
    # Preflight warns in train-project's words, and fails the pictures the cut lost.
    results = preflight(project)
    assert results["shards"][0] == "WARN" and results["shards"][1].endswith(f"; {warning}")
    assert failed(results) == ["images"] and f"truncated: in {shard}, which ends early" in results["images"][1]
    positions = np.concatenate([batch["position"] for batch in batches])
    lost = sorted(set(range(24)) - set(positions.tolist()))
    assert 0 < len(lost) <= 10  # some of shard 2's ten pictures, none of the others
    index = json.loads((project / "shards" / "shard-00001.json").read_text())
    in_shard = {f"{plan.train.images_dir}/{key}" for key, _, _ in index["records"]}
    assert {plan.train.paths()[p] for p in lost} <= in_shard
    tracker = BadImageTracker(project / "logs" / "bad_images.txt", plan.train.paths(), max_image_pixels=10**8,
                              context="epoch 1", diagnose_path=reader.diagnose)
    tracker.observe(positions)
    assert tracker.finish(0, 24) == len(lost)
    assert all(reason.startswith(f"truncated: in {shard}, which ends early") for _, _, reason in tracker.last_bad)


def test_a_flipped_byte_is_a_bad_image_named_by_shard_and_offset_and_pack_verify_finds_it(packed):
    from deepdanbooru.pipeline import BadImageTracker

    project, _, _ = packed
    plan = plan_training(project)
    victim = plan.train.paths()[13]
    number, offset, length = plan.shards.locations[victim]
    shard = project / "shards" / f"shard-{number:05d}.tfrecord"
    data = bytearray(shard.read_bytes())
    data[offset + length // 2] ^= 0x04  # inside the JPEG bytes: it would still parse and decode
    shard.write_bytes(bytes(data))

    plan, reader, batches = _datasets(project, shards=True)
    positions = np.concatenate([batch["position"] for batch in batches])
    assert sorted(set(range(24)) - set(positions.tolist())) == [13]  # that record only; the rest are used
    tracker = BadImageTracker(project / "logs" / "bad_images.txt", plan.train.paths(), max_image_pixels=10**8,
                              context="epoch 1", diagnose_path=reader.diagnose)
    tracker.observe(positions)
    assert tracker.finish(0, 24) == 1
    ((position, path, reason),) = tracker.last_bad
    assert (position, path) == (13, victim)
    assert reason == (f"cannot be decoded: its record in {shard} at byte {offset - 12:,} fails its checksum (damaged "
                      f"on disk); delete that shard and run `deepdanbooru pack {project}` to pack it again")
    assert tracker.reasons == {"cannot be decoded": 1}
    assert f"epoch 1\t13\t{victim}\t{reason}" in (project / "logs" / "bad_images.txt").read_text()

    result = CliRunner().invoke(main, ["pack", str(project), "--verify"])
    assert result.exit_code == exitcodes.FAILED, result.output
    key = victim[len(str(plan.train.images_dir)) + 1:]
    assert f"bad record: {key}: cannot be decoded: its record in {shard} at byte {offset - 12:,}" in result.output
    assert result.output.splitlines()[-1].startswith("24 records checked in ") and result.output.endswith(": 1 bad\n")

    # Deleting the damaged shard and packing again repacks it alone; then every record checks out.
    shard.unlink()
    assert pack_project(project, shard_records=10, **QUIET).packed_now == 1
    result = CliRunner().invoke(main, ["pack", str(project), "--verify"])
    assert result.exit_code == 0 and result.output.endswith(": all good\n"), result.output


def test_shards_meet_mixup_white_padding_and_the_flip_with_the_files_records_and_mixed_labels(packed):
    """Packed pictures take OpenCV's warp a batch at a time: with mixup, white padding and the flip on they
    still give the records, the mixed labels and (to the JPEG re-encoding) the pictures the files give, and
    the same batches every time."""
    project, _, _ = packed
    set_config(project, mixup=0.4, padding="white", horizontal_flip=True)
    _, _, files = _datasets(project, shards=False)
    _, _, shards = _datasets(project, shards=True)
    _, _, again = _datasets(project, shards=True)
    assert len(files) == len(shards) == len(again) == 6
    for a, b, c in zip(files, shards, again, strict=True):
        np.testing.assert_array_equal(a["position"], b["position"])
        np.testing.assert_allclose(a["label"], b["label"], atol=1e-6)
        assert 0 < np.abs(a["image"] - b["image"]).mean() < 0.03
        np.testing.assert_array_equal(b["image"], c["image"])
        np.testing.assert_array_equal(b["label"], c["label"])


def test_a_checked_record_whose_picture_cannot_be_decoded_is_a_named_bad_image_and_its_batch_is_used(packed):
    """A record whose CRCs hold but whose JPEG the decoder refuses (its scan asks for a Huffman table it
    does not define) drops out of its batch like any bad image; the batch's other pictures are used."""
    import tensorflow as tf

    from deepdanbooru.pipeline import BadImageTracker
    from deepdanbooru.pipeline.packed import FEATURES, example_bytes

    project, _, _ = packed
    plan = plan_training(project)
    victim = plan.train.paths()[5]
    number, _, _ = plan.shards.locations[victim]
    shard = project / "shards" / f"shard-{number:05d}.tfrecord"
    rewritten = []
    for record in tf.data.TFRecordDataset(str(shard)).as_numpy_iterator():
        example = tf.io.parse_single_example(record, FEATURES)
        key = example["key"].numpy().decode()
        if victim.endswith(key):
            image = example["image"].numpy()
            at = image.index(b"\xff\xda") + 6
            labels = tf.sparse.to_dense(example["labels"]).numpy().tolist()
            record = example_bytes(image[:at] + b"\x33" + image[at + 1:], labels, key)  # same length
        rewritten.append(record)
    with tf.io.TFRecordWriter(str(shard)) as writer:  # new CRCs: the record checks out when read
        for record in rewritten:
            writer.write(record)

    plan, reader, batches = _datasets(project, shards=True)
    positions = np.concatenate([batch["position"] for batch in batches])
    assert sorted(set(range(24)) - set(positions.tolist())) == [5]
    assert sum(len(batch["image"]) for batch in batches) == sum(len(batch["label"]) for batch in batches) == 23
    tracker = BadImageTracker(project / "logs" / "bad_images.txt", plan.train.paths(), max_image_pixels=10**8,
                              context="epoch 1", diagnose_path=reader.diagnose)
    tracker.observe(positions)
    assert tracker.finish(0, 24) == 1
    ((position, path, reason),) = tracker.last_bad
    assert (position, path) == (5, victim) and reason.startswith("cannot be decoded"), reason


def test_pack_verify_without_shards_is_one_line(tmp_path, sample_dataset):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    project = make_project(tmp_path / "project", database, tags)
    result = CliRunner().invoke(main, ["pack", str(project), "--verify"])
    assert result.exit_code == exitcodes.USAGE
    assert "no finished shard set to verify" in result.output and "Traceback" not in result.output


def test_unfinished_pack_is_never_read_and_packing_resumes(tmp_path, sample_dataset, monkeypatch):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    project = make_project(tmp_path / "project", database, tags)
    real = packing.pack_shard

    def interrupted(number, start, stop):
        if number == 2:
            raise KeyboardInterrupt
        return real(number, start, stop)

    monkeypatch.setattr(packing, "pack_shard", interrupted)
    with pytest.raises(Interrupted, match=rf"packing stopped with 2 of 3 shards finished; `deepdanbooru pack "
                                          rf"{project}` continues"):
        pack_project(project, shard_records=10, **QUIET)
    assert not (project / "shards" / "manifest.json").exists()
    with pytest.raises(TrainingError, match=r"shards: packing did not finish \(no manifest.json\); finish it with "
                                            rf"`deepdanbooru pack {project}`") as raised:
        plan_training(project)
    results = preflight(project)
    assert failed(results) == ["shards"] and results["shards"][1] == str(raised.value)
    monkeypatch.setattr(packing, "pack_shard", real)
    lines = []
    summary = pack_project(project, echo=lines.append, shard_records=10)
    assert summary.packed_now == 1 and summary.pictures == 24
    assert "(2 already packed)" in lines[0] and lines[1].startswith("  shard 3/3: 4 pictures")
    # The same bytes as an uninterrupted pack.
    fresh = make_project(tmp_path / "fresh", database, tags)
    pack_project(fresh, shard_records=10, **QUIET)
    for n in range(3):
        name = f"shard-0000{n}.tfrecord"
        assert (project / "shards" / name).read_bytes() == (fresh / "shards" / name).read_bytes()


def test_a_full_disk_leaves_nothing_half_written(tmp_path, sample_dataset, monkeypatch):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    project = make_project(tmp_path / "project", database, tags)
    real = packing.write_bytes_atomic

    def fills_up(path, content):
        if path.name == "shard-00001.tfrecord":
            # What write_bytes_atomic leaves when the disk fills mid-write: nothing (its temporary is removed).
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, content)

    monkeypatch.setattr(packing, "write_bytes_atomic", fills_up)
    with pytest.raises(DatasetError) as raised:
        pack_project(project, shard_records=10, **QUIET)
    assert str(raised.value) == (
        f"{project / 'shards' / 'shard-00001.tfrecord'}: the disk is full while packing; 1 of 3 shards are finished "
        f"and kept, nothing half-written is left; free space and run `deepdanbooru pack {project}` again to continue")
    assert sorted(p.name for p in (project / "shards").iterdir()) == [
        "plan.json", "shard-00000.json", "shard-00000.tfrecord"]
    monkeypatch.setattr(packing, "write_bytes_atomic", real)
    assert pack_project(project, shard_records=10, **QUIET).packed_now == 2
    assert plan_training(project).shards is not None


def test_cli_pack(tmp_path, sample_dataset):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    project = make_project(tmp_path / "project", database, tags)
    result = CliRunner().invoke(main, ["pack", str(project)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("into 1 shard in " + str(project / "shards") + ", 1 process")
    assert re.match(r"Packed 24 pictures into 1 shard: \d+\.\d kB, (\d+ B|\d\.\d kB) a picture, ", lines[-1]), lines[-1]
    assert plan_training(project).shards is not None


@pytest.mark.slow
def test_two_worker_processes_write_the_same_shards(tmp_path, sample_dataset):
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    project = make_project(tmp_path / "project", database, tags)
    lines = []
    assert pack_project(project, workers=2, echo=lines.append, shard_records=10).packed_now == 3
    assert lines[0].endswith(", 2 processes")
    single = make_project(tmp_path / "single", database, tags)
    pack_project(single, shard_records=10, **QUIET)
    for n in range(3):
        name = f"shard-0000{n}.tfrecord"
        assert (project / "shards" / name).read_bytes() == (single / "shards" / name).read_bytes()


@pytest.mark.slow
def test_training_from_shards_resumes_exactly_and_counts_bad_images(tmp_path, sample_dataset):
    """A picture that failed to decode while packing is logged by pack, then dropped, counted and logged by
    every epoch as today; a run resumed from a mid-epoch checkpoint ends with the same weights."""
    database, tags = _copy_dataset(sample_dataset, tmp_path / "dataset")
    broken = next((database.parent / "images").rglob("*.jpg"))
    broken.write_bytes(b"\xff\xd8\xff truncated")
    project = make_project(tmp_path / "reference", database, tags, max_bad_image_fraction=0.5)
    summary = pack_project(project, **QUIET)
    assert (summary.pictures, summary.bad) == (23, 1)
    log = (project / "logs" / "bad_images.txt").read_text().splitlines()
    # Cut after its first marker: truncated, in the reason the pipeline's own diagnosis gives.
    assert len(log) == 1 and log[0].startswith("pack\t") and f"\t{broken}\ttruncated: jpeg of 13 bytes" in log[0]
    from deepdanbooru.training.train import train_project

    lines = []
    train_project(project, echo=lines.append)
    assert f"Pictures: packed, from {project / 'shards'}" in lines
    assert read_state(project)["used_sample"] == 46  # 23 usable pictures a epoch, two epochs
    log = (project / "logs" / "bad_images.txt").read_text().splitlines()
    assert [line.split("\t")[0] for line in log] == ["pack", "epoch 1", "epoch 2"]
    assert len({line.split("\t", 2)[2] for line in log}) == 1  # the same path and reason each time

    resumed = tmp_path / "resumed"
    shutil.copytree(project, resumed)
    # ckpt-5: epoch 2, offset 16 of 23 (the kept checkpoints are the last three of six).
    (resumed / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-5"\nall_model_checkpoint_paths: "ckpt-5"\n')
    for export in resumed.glob("*.keras"):
        export.unlink()
    lines = []
    train_project(resumed, echo=lines.append)
    assert any(line.startswith("Resuming from ") and "used_epoch=1" in line for line in lines)
    assert read_state(resumed)["used_sample"] == 46
    for name in ("model-resnet_small.e2.keras", "model-resnet_small.keras"):
        assert_same_weights(project / name, resumed / name)


@pytest.fixture(scope="module")
def with_validation_once(tmp_path_factory, sample_dataset):
    return _pack_once(tmp_path_factory.mktemp("with_validation"), sample_dataset, validation_fraction=0.3)


@pytest.fixture
def with_validation(tmp_path, with_validation_once):
    """A tiny project with a validation split, packed (training and validation parts; packed once per module,
    copied for each test)."""
    project, _, lines = _copy_packed(with_validation_once, tmp_path)
    return project, lines


def _scored(project):
    from deepdanbooru.pipeline.packed import scoring_input

    plan = plan_training(project)
    scoring = scoring_input(project, plan.config, plan.validation, plan.tags)
    return plan, scoring, list(scoring.dataset.as_numpy_iterator())


def test_validation_pictures_are_packed_at_the_image_size_and_scored_from_the_shards(with_validation):
    project, lines = with_validation
    plan, scoring, packed = _scored(project)
    count = len(plan.validation)
    assert 0 < count < 24 and f"Packing {count} validation pictures at 32x32 into 1 shard" in lines
    assert lines[-1] == f"Packed {count} validation pictures"
    manifest = json.loads((project / "shards" / "manifest.json").read_text())
    assert manifest["validation"]["made_from"]["box"] == [32, 32] and manifest["validation"]["pictures"] == count
    assert scoring.source == str(project / "shards") and scoring.notice is None
    shutil.move(project / "shards", project.parent / "aside")
    _, original, files = _scored(project)
    assert original.source == "original files" and original.notice is None
    for a, b in zip(files, packed, strict=True):
        np.testing.assert_array_equal(a["position"], b["position"])
        np.testing.assert_array_equal(a["label"], b["label"])
        assert np.abs(a["image"] - b["image"]).mean() < 0.02  # only the JPEG re-encoding differs
    shutil.move(project.parent / "aside", project / "shards")
    again = []
    pack_project(project, echo=again.append, shard_records=10)
    assert again == [f"{project / 'shards'}: up to date (24 pictures in 3 shards, {count} validation pictures)"]
    # Preflight then asks for no original file at all, validation posts included.
    shutil.rmtree(plan.train.images_dir)
    results = preflight(project)
    assert failed(results) == [], results
    assert results["shards"][1].endswith(f"; validation reads its {count} pictures from the validation part")


def test_evaluate_project_scores_the_validation_split_from_the_shards_without_the_originals(with_validation):
    """With every original picture gone, evaluate-project --metrics still scores each validation post: from the
    shard set's validation part, with nothing skipped and no notice."""
    from deepdanbooru.inference.project_metrics import project_metrics
    from deepdanbooru.models import build_model

    project, _ = with_validation
    plan = plan_training(project)
    build_model("resnet_small", (32, 32, 3), len(plan.tags), seed=0).save(project / "model-resnet_small.keras")
    shutil.rmtree(plan.train.images_dir)
    out, err = [], []
    summary = project_metrics(project, echo=out.append, echo_err=err.append)
    assert summary.records == len(plan.validation) and summary.skipped == [] and err == []
    assert any(line.startswith(f"Records: {len(plan.validation)} (validation split") for line in out)


@pytest.mark.slow
def test_training_validates_from_the_shards_with_every_original_picture_gone(with_validation):
    """train-project says where validation reads its pictures, and with the originals deleted every validation
    of the run still scores each validation post (from the validation part), nothing counted as bad."""
    from deepdanbooru.training.history import read_history
    from deepdanbooru.training.train import train_project

    project, _ = with_validation
    plan = plan_training(project)
    shutil.rmtree(plan.train.images_dir)
    lines = []
    train_project(project, echo=lines.append)
    assert f"Pictures: packed, from {project / 'shards'}" in lines
    assert f"Validation pictures: packed, from {project / 'shards'}" in lines
    validations = [row for row in read_history(project / "logs" / "history.jsonl") if row["kind"] == "validation"]
    assert validations and all(row["samples"] == len(plan.validation) for row in validations)
    assert not (project / "logs" / "bad_images.txt").exists()


def test_a_shard_set_packed_without_validation_says_how_to_add_it_and_pack_adds_only_that(with_validation):
    project, _ = with_validation
    directory = project / "shards"
    manifest = json.loads((directory / "manifest.json").read_text())
    del manifest["validation"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "validation-00000.tfrecord").unlink()
    (directory / "validation-00000.json").unlink()
    _, scoring, batches = _scored(project)
    assert scoring.source == "original files" and sum(len(b["position"]) for b in batches) == len(scoring.paths)
    assert scoring.notice == (f"notice: {directory} has no validation part (packed before validation pictures were "
                              "packed); the pictures are read from their original files; "
                              f"`deepdanbooru pack {project}` adds it and keeps the training shards")
    lines = []
    assert pack_project(project, echo=lines.append, shard_records=10).packed_now == 0  # training shards kept
    assert lines[0].startswith("Packing ") and "validation pictures at 32x32" in lines[0]
    assert _scored(project)[1].source == str(directory)


def test_a_damaged_validation_record_is_a_named_bad_image(with_validation):
    from deepdanbooru.pipeline import BadImageTracker

    project, _ = with_validation
    plan, scoring, _ = _scored(project)
    index = json.loads((project / "shards" / "validation-00000.json").read_text())
    key, offset, length = index["records"][1]
    shard = project / "shards" / "validation-00000.tfrecord"
    data = bytearray(shard.read_bytes())
    data[offset + length - 40] ^= 0x01
    shard.write_bytes(bytes(data))
    _, scoring, batches = _scored(project)
    tracker = BadImageTracker(project / "logs" / "bad_images.txt", scoring.paths, max_image_pixels=10**8,
                              context="validation", diagnose_path=scoring.diagnose)
    for batch in batches:
        tracker.observe(batch["position"])
    assert tracker.finish(0, len(scoring.paths)) == 1
    ((_, path, reason),) = tracker.last_bad
    assert path.endswith(key) and reason.startswith(f"cannot be decoded: its record in {shard} at byte {offset - 12:,}")
    # pack --verify reads the validation part too.
    result = CliRunner().invoke(main, ["pack", str(project), "--verify"])
    assert result.exit_code == exitcodes.FAILED, result.output
    assert f"bad record: validation {key}: cannot be decoded: its record in {shard} at byte {offset - 12:,}" in \
        result.output
    assert "(training and validation parts)" in result.output and result.output.endswith(": 1 bad\n")


def test_a_missing_validation_shard_falls_back_with_a_notice_and_pack_restores_it(with_validation):
    project, _ = with_validation
    (project / "shards" / "validation-00000.tfrecord").unlink()
    _, scoring, _ = _scored(project)
    assert scoring.source == "original files"
    assert scoring.notice == (f"notice: {project / 'shards'}: a validation shard is missing or cut short; the "
                              f"pictures are read from their original files; `deepdanbooru pack {project}` packs it "
                              "again")
    assert pack_project(project, shard_records=10, **QUIET).packed_now == 0
    assert _scored(project)[1].source == str(project / "shards")
