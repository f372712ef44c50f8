"""Duplicates across the validation split: the hashes, the preflight report on planted duplicates, and grouping."""

import json
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from deepdanbooru.cli import main
from deepdanbooru.dataset import duplicates
from deepdanbooru.dataset.build import INSERT_POST, POSTS_SCHEMA
from deepdanbooru.dataset.records import image_path, load_records
from deepdanbooru.project.split import in_validation

FRACTION, SEED = 0.5, 0


def run_cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def noise(seed, size=32):
    """A picture with structure at the hash's scale: random 6x6 colours, smoothly enlarged."""
    cells = np.random.default_rng(seed).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    return Image.fromarray(cells).resize((size, size), Image.Resampling.BICUBIC)


def other_side(post_id, start):
    """The first id >= start on the other side of the split from post_id."""
    side = in_validation(post_id, FRACTION, SEED)
    candidate = start
    while in_validation(candidate, FRACTION, SEED) == side:
        candidate += 1
    return candidate


def write_dataset(directory, posts):
    """posts: (id, md5, ext, PIL image or None for a row naming an existing file)."""
    (directory / "images").mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(directory / "dataset.sqlite")
    connection.execute(POSTS_SCHEMA)
    for post_id, md5, ext, image in posts:
        if image is not None:
            path = image_path(directory / "images", md5, ext)
            (directory / "images" / md5[:2]).mkdir(exist_ok=True)
            image.save(path, format="PNG")
        connection.execute(INSERT_POST, (post_id, md5, ext, "a b", 2, "g", 0, 0))
    connection.commit()
    connection.close()
    return directory / "dataset.sqlite"


@pytest.fixture
def planted(tmp_path):
    """30 distinct noise pictures (ids 1..30) and three planted copies, each on the other side from its original:
    a row naming the same file as post 1, a byte-identical file of post 2 under another name, and post 3
    brightened by 2 levels (other bytes, same picture). Returns (project, ids of the copies)."""
    posts = [(i, f"{i:02d}" + "f" * 30, "png", noise(i)) for i in range(1, 31)]
    row_copy = other_side(1, 1000)
    file_copy = other_side(2, row_copy + 1)
    near_copy = other_side(3, file_copy + 1)
    brighter = Image.fromarray(np.clip(np.asarray(noise(3), np.int16) + 2, 0, 255).astype(np.uint8))
    posts += [(row_copy, posts[0][1], "png", None), (file_copy, "aa" + "e" * 30, "png", noise(2)),
              (near_copy, "bb" + "e" * 30, "png", brighter)]
    database = write_dataset(tmp_path / "dataset", posts)
    project = tmp_path / "project"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({
        "database_path": str(database), "minimum_tag_count": 1, "image_width": 32, "image_height": 32,
        "model": "resnet_small", "validation_fraction": FRACTION, "seed": SEED}))
    (project / "tags.txt").write_text("a\nb\n")
    return project, (row_copy, file_copy, near_copy)


def preflight_line(project, *extra):
    result = run_cli("preflight", project, "--json", *extra)
    checks = {check["name"]: check for check in json.loads(result.output)["checks"]}
    return checks["duplicates"]


def test_split_rule_on_python_ints_matches_the_vectorised_rule():
    # One expression serves both; Python ints must be masked to 64 bits where numpy's uint64 wraps.
    from deepdanbooru.scoring.split import validation_mask

    ids = [-5, 0, 1, 2, 3, 99, 12345, 2**62, 2**63 - 1]
    for fraction, seed in ((0.1, 0), (0.5, 7), (0.9, 2**40)):
        expected = validation_mask(ids, fraction, seed).tolist()
        assert [in_validation(i, fraction, seed) for i in ids] == expected
    assert not in_validation(5, 0.0, 0)


def test_dhash_sees_the_same_picture_and_tells_others_apart(tmp_path):
    picture = noise(0, 64)
    picture.save(tmp_path / "a.png")
    picture.resize((48, 48), Image.Resampling.BILINEAR).save(tmp_path / "b.jpg", quality=90)
    noise(1, 64).save(tmp_path / "c.png")
    a, b, c = (duplicates.dhash(tmp_path / name) for name in ("a.png", "b.jpg", "c.png"))
    assert 0 <= a < 2**64
    assert (a ^ b).bit_count() <= duplicates.DEFAULT_MAX_DISTANCE
    assert (a ^ c).bit_count() > 16


def test_a_picture_too_large_for_pillow_is_unreadable_not_a_crash(tmp_path, monkeypatch, planted):
    # Pillow refuses headers declaring more than twice MAX_IMAGE_PIXELS with its own exception class, which
    # stopped preflight --check-duplicates and make-training-database --group-duplicates with a traceback.
    noise(0, 64).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match="decompression bomb"):
        duplicates.dhash(tmp_path / "big.png")
    project, _ = planted
    full = preflight_line(project, "--check-duplicates")
    assert full["status"] == "WARN" and "could not be read" in full["detail"]


def test_near_pairs_equal_a_brute_force_search():
    rng = np.random.default_rng(3)
    hashes = {i: int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)) for i in range(200)}
    for i in range(0, 40, 2):  # plant pairs 0..6 bits apart
        flips = rng.choice(64, size=i % 7, replace=False)
        hashes[1000 + i] = hashes[i] ^ sum(1 << int(bit) for bit in flips)
    keys = sorted(hashes)
    brute = {(a, b) for x, a in enumerate(keys) for b in keys[x + 1:] if (hashes[a] ^ hashes[b]).bit_count() <= 4}
    assert duplicates.near_pairs(hashes, 4) == brute
    assert len(brute) >= 10


def test_preflight_counts_the_planted_pairs_crossing_the_split(planted):
    project, _ = planted
    quick = preflight_line(project)
    # Without reading images only the row naming post 1's file is seen.
    assert quick["status"] == "WARN"
    assert "1 pair(s) of identical images cross the split (1 identical, 0 near-identical)" in quick["detail"]
    assert "--check-duplicates reads every image" in quick["detail"]
    full = preflight_line(project, "--check-duplicates")
    assert full["status"] == "WARN"
    assert ("3 pair(s) of identical or near-identical (dHash within 4 bits) images cross the split "
            "(2 identical, 1 near-identical): 3 of") in full["detail"]


def test_preflight_without_pillow_reports_identical_files_only(planted, monkeypatch):
    from deepdanbooru.preflight.main import training_preflight

    monkeypatch.setattr(duplicates, "pillow_available", lambda: False)
    project, _ = planted
    result = next(r for r in training_preflight(project, check_duplicates=True) if r.name == "duplicates")
    assert "2 pair(s) of identical images cross the split (2 identical, 0 near-identical)" in result.detail
    assert "Pillow is not installed" in result.detail


def test_make_training_database_groups_duplicates_onto_one_side(planted, tmp_path):
    from deepdanbooru.scoring.split import split_records

    project, copies = planted
    source = tmp_path / "dataset" / "dataset.sqlite"
    output = tmp_path / "dataset" / "grouped.sqlite"
    result = run_cli("make-training-database", source, output, "--group-duplicates")
    assert result.exit_code == 0, result.output
    assert "Grouped 6 posts in 3 groups of identical or near-identical" in result.output
    keys = dict(sqlite3.connect(output).execute("SELECT id, split_id FROM posts WHERE split_id IS NOT NULL"))
    assert keys == {copies[0]: 1, copies[1]: 2, copies[2]: 3}
    records = load_records(output, 1)
    train, validation = split_records(records, FRACTION, SEED)
    for original, copy in zip((1, 2, 3), copies):
        assert (original in validation.ids) == (copy in validation.ids)
    # Posts outside a group keep their side: the split of the other 27 is unchanged.
    _, before = split_records(load_records(source, 1), FRACTION, SEED)
    assert set(validation.ids) - set(copies) == set(before.ids) - set(copies)
    config = json.loads((project / "project.json").read_text())
    (project / "project.json").write_text(json.dumps({**config, "database_path": str(output)}))
    check = preflight_line(project, "--check-duplicates")
    assert check["status"] == "PASS" and "no identical or near-identical" in check["detail"]


def test_import_images_groups_near_duplicates_in_a_new_dataset_only(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for index in range(12):
        noise(index).save(source / f"{index}.png")
        (source / f"{index}.txt").write_text("a, b")
    picture = np.asarray(noise(0), np.int16)
    Image.fromarray(np.clip(picture - 3, 0, 255).astype(np.uint8)).save(source / "darker.png")
    (source / "darker.txt").write_text("a, b")
    result = run_cli("import-images", source, tmp_path / "dataset", "--group-duplicates")
    assert result.exit_code == 0, result.output
    assert "Grouped 2 posts in 1 groups" in result.output
    rows = sqlite3.connect(tmp_path / "dataset" / "dataset.sqlite").execute(
        "SELECT id, split_id FROM posts WHERE split_id IS NOT NULL").fetchall()
    assert len(rows) == 1 and rows[0][1] < rows[0][0]
    again = run_cli("import-images", source, tmp_path / "dataset", "--group-duplicates")
    assert again.exit_code == 2 and "applies to a new dataset only" in again.output


def test_a_run_started_before_grouping_keeps_its_split(planted, tmp_path):
    from deepdanbooru.scoring.split import records_hash, split_for_run, split_records

    project, copies = planted
    source = tmp_path / "dataset" / "dataset.sqlite"
    grouped = tmp_path / "dataset" / "grouped.sqlite"
    assert run_cli("make-training-database", source, grouped, "--group-duplicates").exit_code == 0
    records = load_records(grouped, 1)
    by_id_train, by_id_validation = split_records(load_records(source, 1), FRACTION, SEED)
    group_train, group_validation = split_records(records, FRACTION, SEED)
    assert set(group_validation.ids) != set(by_id_validation.ids)  # grouping moved the copies

    def validation_ids(state):
        train, validation, note = split_for_run(records, FRACTION, SEED, state)
        return set(validation.ids), note

    # A fresh run, or one started on the grouped database: the grouped split.
    assert validation_ids(None) == (set(group_validation.ids), None)
    assert validation_ids({"records_hash": records_hash(group_train)}) == (set(group_validation.ids), None)
    # A run started on the database before it had split_id (or before state.json had the hash): its split.
    for state in ({"records_hash": records_hash(by_id_train)}, {"used_epoch": 1}):
        ids, note = validation_ids(state)
        assert ids == set(by_id_validation.ids)
        assert "posts.split_id is ignored for this run" in note
