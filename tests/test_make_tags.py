import json
import sqlite3
from collections import Counter

import pytest
from click.testing import CliRunner

from deepdanbooru.cli import main
from deepdanbooru.dataset.build import rank_tags
from deepdanbooru.project.tags import count_tags
from deepdanbooru.project.tags import load_tags


def make_project(tmp_path, rows, minimum_tag_count=0, extra=None):
    tmp_path.mkdir(exist_ok=True)
    database = tmp_path / "data" / "posts.sqlite"
    database.parent.mkdir()
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE posts (id INTEGER PRIMARY KEY, md5 TEXT, file_ext TEXT, tag_string TEXT, "
                       "tag_count_general INTEGER)")
    connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?, ?)", rows)
    connection.commit()
    connection.close()
    project = tmp_path / "project"
    project.mkdir()
    config = {"database_path": "../data/posts.sqlite", "minimum_tag_count": minimum_tag_count, **(extra or {})}
    (project / "project.json").write_text(json.dumps(config))
    return project


ROWS = [
    (1, "a1", "jpg", "cat dog rating:explicit", 2),
    (2, "a2", "png", "cat bird rating:general", 2),
    (3, "a3", "jpg", "cat dog dog rating:general", 2),  # dog twice in one post counts once
    (4, "a4", "gif", "cat fish", 2),  # gif: not eligible by default
    (5, "a5", "jpg", "bird ant", 1),
    (6, "a6", "jpeg", "zebra", 0),
]


def invoke(*args):
    return CliRunner().invoke(main, ["make-tags", *map(str, args)])


def test_tags_by_frequency_ties_by_name_rating_last(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == [
        "cat", "bird", "dog", "ant", "zebra", "rating:general", "rating:explicit"]
    assert "Wrote 7 tags (2 rating system tags)" in result.output
    assert "from 5 eligible of 6 posts" in result.output
    assert "most frequent: cat (3), bird (2), dog (2)" in result.output


def test_min_count_limit_and_no_system_tags(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project, "--minimum-post-count", 2, "--limit", 2)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == ["cat", "bird", "rating:general"]
    out = tmp_path / "other.txt"
    result = invoke(project, "--no-system-tags", "--save-path", out)
    assert result.exit_code == 0, result.output
    assert out.read_text() == "cat\nbird\ndog\nant\nzebra\n"


def test_uses_project_eligibility(tmp_path):
    project = make_project(tmp_path, ROWS, minimum_tag_count=2, extra={"image_extensions": ["jpg", "png", "gif"]})
    result = invoke(project, "--no-system-tags")
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt") == ["cat", "dog", "bird", "fish"]


def test_refuses_to_overwrite(tmp_path):
    project = make_project(tmp_path, ROWS)
    (project / "tags.txt").write_text("old\n")
    result = invoke(project)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {project / 'tags.txt'}: already exists; use --overwrite to replace it"
    assert (project / "tags.txt").read_text() == "old\n"
    assert invoke(project, "--overwrite").exit_code == 0
    assert (project / "tags.txt").read_text().startswith("cat\n")


def test_no_tag_reaches_min_count(tmp_path):
    project = make_project(tmp_path, ROWS)
    result = invoke(project, "--minimum-post-count", 4)
    assert result.exit_code == 2
    assert "no tag occurs in 4 or more of the 5 eligible posts" in result.output
    assert not (project / "tags.txt").exists()


def test_no_eligible_posts_names_minimum_tag_count(tmp_path):
    project = make_project(tmp_path, ROWS, minimum_tag_count=50)
    result = invoke(project)
    assert result.exit_code == 2
    assert "no eligible posts" in result.output and "tag_count_general >= 50" in result.output
    assert not (project / "tags.txt").exists()


def test_bad_project_inputs(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "project.json").write_text(json.dumps({"database_path": None}))
    result = invoke(project)
    assert result.exit_code == 2 and "database_path: is null" in result.output

    (project / "project.json").write_text(json.dumps({"database_path": "nope.sqlite"}))
    result = invoke(project)
    assert result.exit_code == 2 and "database_path: file not found" in result.output

    make_project(tmp_path / "other", ROWS)
    (project / "project.json").write_text(json.dumps({"database_path": str(tmp_path / "other/data/posts.sqlite")}))
    result = invoke(project, "--save-path", tmp_path / "missing" / "tags.txt")
    assert result.exit_code == 2
    assert f"{tmp_path / 'missing' / 'tags.txt'}: directory {tmp_path / 'missing'} does not exist" in result.output

    result = invoke(project, "--minimum-post-count", 0)
    assert result.exit_code == 2 and "--minimum-post-count" in result.output
    assert not (project / "tags.txt").exists()


def test_keys_make_tags_does_not_use_only_warn(tmp_path):
    project = make_project(tmp_path, ROWS, extra={"model": "resnet_bogus", "minibatch_size": 0})
    result = invoke(project)
    assert result.exit_code == 0, result.output
    assert load_tags(project / "tags.txt")[0] == "cat"
    assert "warning: " in result.output and "model: must be one of" in result.output


def test_rank_tags_directly():
    counts = count_tags(["b a", "a c rating:questionable rating:sensitive", "a b", "rating:safe x"])
    assert counts == Counter({"a": 3, "b": 2, "c": 1, "x": 1, "rating:questionable": 1, "rating:sensitive": 1,
                              "rating:safe": 1})
    # Known rating tags in DeepDanbooru order, unknown rating:* after them.
    assert rank_tags(counts) == ["a", "b", "c", "x", "rating:sensitive", "rating:questionable", "rating:safe"]
    assert rank_tags(counts, limit=1, system_tags=False) == ["a"]


def _trained(project, what):
    """What training leaves in a project: a checkpoint (its files), or an exported model."""
    if what == "checkpoint":
        (project / "checkpoints").mkdir()
        (project / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
        (project / "checkpoints" / "ckpt-3.index").write_bytes(b"index")
        return (f"the checkpoints in {project / 'checkpoints'} were trained with it, and with other tags "
                "train-project refuses to resume from the checkpoints")
    (project / "model-resnet_small.keras").write_bytes(b"model")
    return ("the exported models (model-resnet_small.keras) were trained with it, and with other tags the exported "
            "models' outputs no longer match the lines of tags.txt that evaluate and evaluate-project read with them")


@pytest.mark.parametrize("what", ["checkpoint", "export"])
def test_tags_that_a_model_was_trained_with_are_only_replaced_when_allowed_and_kept(tmp_path, what):
    project = make_project(tmp_path, ROWS)
    assert invoke(project).exit_code == 0
    tags = project / "tags.txt"
    old = tags.read_text()
    trained = _trained(project, what)

    result = invoke(project, "--overwrite", "--minimum-post-count", 2)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {tags}: not replaced: {trained}; for other tags start a new project (create-project, then "
        "make-tags there), or add --allow-trained to replace it anyway (the current file is kept beside it)"]
    assert tags.read_text() == old
    assert sorted(p.name for p in project.iterdir() if p.name.startswith("tags")) == ["tags.txt"]
    # Another file than the project's tags.txt is nobody's vocabulary.
    assert invoke(project, "--minimum-post-count", 2, "--save-path", tmp_path / "other.txt").exit_code == 0

    result = invoke(project, "--overwrite", "--allow-trained", "--minimum-post-count", 2)
    assert result.exit_code == 0, result.output
    assert load_tags(tags) == ["cat", "bird", "dog", "rating:general"]
    (kept,) = [p for p in project.iterdir() if p.name.startswith("tags.replaced-")]
    assert kept.suffix == ".txt" and kept.read_text() == old
    assert f"Kept the previous tags.txt as {kept}: " in result.output
    assert ("move that folder away to start fresh" in result.output) == (what == "checkpoint")
    # Again: the first copy stays, a second keeps what the file held then.
    assert invoke(project, "--overwrite", "--allow-trained").exit_code == 0
    copies = sorted(p for p in project.iterdir() if p.name.startswith("tags.replaced-"))
    assert len(copies) == 2 and kept in copies and old in [p.read_text() for p in copies]


def test_overwrite_with_save_path_replaces_only_another_tag_list(tmp_path):
    project = make_project(tmp_path, ROWS)
    model = tmp_path / "model.keras"
    model.write_bytes(b"PK\x03\x04\x00\xff")
    notes = tmp_path / "notes.txt"
    notes.write_text("a list of things to do\n")
    thresholds = tmp_path / "model-x.thresholds.csv"
    thresholds.write_text("tag,threshold,precision,recall,f1,support\ncat,0.4,1,1,1,3\n")
    for target, reason in [(project / "project.json", "it is one of the project's own files"),
                           (thresholds, "it is not a tag list (one tag a line)"),
                           (model, "it is not a tag list (one tag a line)"),
                           (notes, "it is not a tag list (one tag a line)")]:
        before = target.read_bytes()
        result = invoke(project, "--overwrite", "--save-path", target)
        assert result.exit_code == 2 and target.read_bytes() == before
        assert result.output.strip() == (f"error: {target}: not replaced: {reason}; --overwrite replaces only a tag "
                                         "list: give another --save-path")
    older = tmp_path / "older.txt"
    older.write_text("cat\ndog\n")
    assert invoke(project, "--overwrite", "--save-path", older).exit_code == 0 and "bird" in older.read_text()


def test_tags_are_not_replaced_under_a_running_train_project(tmp_path):
    import json
    import os
    import socket

    project = make_project(tmp_path, ROWS)
    assert invoke(project).exit_code == 0
    tags = project / "tags.txt"
    old = tags.read_text()
    lock = project / ".train.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "hostname": socket.gethostname(), "started": 1.0}))
    result = invoke(project, "--overwrite", "--allow-trained", "--minimum-post-count", 2)
    assert result.exit_code == 2 and tags.read_text() == old
    assert result.output.strip().startswith(f"error: {tags}: not replaced: a train-project holds this project (pid "
                                            f"{os.getpid()} on host")
    lock.write_text(json.dumps({"pid": 2 ** 22 + 12345, "hostname": socket.gethostname(), "started": 1.0}))
    assert invoke(project, "--overwrite", "--minimum-post-count", 2).exit_code == 0  # a dead run's lock


def test_the_same_tags_again_need_no_permission_and_keep_no_copy(tmp_path):
    project = make_project(tmp_path, ROWS)
    assert invoke(project).exit_code == 0
    _trained(project, "checkpoint")
    result = invoke(project, "--overwrite")
    assert result.exit_code == 0 and "Kept" not in result.output
    assert [p.name for p in project.iterdir() if p.name.startswith("tags")] == ["tags.txt"]


# 20 posts; with validation_fraction 0.3 and seed 0, posts 1, 4, 5, 13 and 18 are the validation split.
SPLIT_ROWS = [(i, f"m{i:02d}", "jpg", " ".join(["common"] + ["edge"] * (i in (1, 2, 3, 6, 7))
                                                 + ["solid"] * (i in (2, 3, 6, 7, 8))), 1) for i in range(1, 21)]


def test_minimum_post_count_counts_the_training_posts_as_the_rare_tag_warning_does(tmp_path):
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.dataset.trust import split_stats, trust_warning
    from deepdanbooru.scoring.split import split_records

    project = make_project(tmp_path, SPLIT_ROWS, extra={"validation_fraction": 0.3})
    result = invoke(project, "--minimum-post-count", 5)
    assert result.exit_code == 0, result.output
    # edge is on 5 posts, one of them in validation: 4 training positives, under the minimum.
    assert load_tags(project / "tags.txt") == ["common", "solid"]
    assert ("counts are over the 15 training posts (the 20 eligible less the 5 of the validation split, "
            "validation_fraction 0.3)") in result.output
    assert "most frequent: common (15), solid (5)" in result.output
    # The split train-project makes and the warning it (and preflight) prints about rare tags agree.
    records = load_records(project.parent / "data" / "posts.sqlite", 0, ("jpg",))
    train, validation = split_records(records, 0.3, 0)
    assert sorted(validation.ids) == [1, 4, 5, 13, 18]
    stats = split_stats([(False, t) for t in train.tag_strings] + [(True, t) for t in validation.tag_strings],
                        load_tags(project / "tags.txt"))
    assert stats.rare_training_tags == 0
    assert "positive examples" not in (trust_warning(stats, 0.3, project / "project.json") or "")


def test_a_split_that_leaves_no_training_post_is_named(tmp_path):
    project = make_project(tmp_path, SPLIT_ROWS[:1], extra={"validation_fraction": 0.3})
    result = invoke(project)
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {project / 'project.json'}: validation_fraction: leaves no training "
                                     "posts out of 1 eligible; lower it")
    assert not (project / "tags.txt").exists()
