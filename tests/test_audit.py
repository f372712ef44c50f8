"""deepdanbooru audit: folds, ranking, audit.csv and its record, applying accepted rows."""

import csv
import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from deepdanbooru.audit.apply import apply_audit, edit_caption
from deepdanbooru.audit.folds import assign_folds
from deepdanbooru.audit.main import finish, given_matrix
from deepdanbooru.audit.ranking import rank_labels
from deepdanbooru.audit.results import COLUMNS, read_suggestions
from deepdanbooru.cli import main
from deepdanbooru.dataset.records import load_records
from deepdanbooru.errors import UserError
from deepdanbooru.project.paths import ProjectPaths
from browser import open_page
from train_helpers import make_project


@pytest.fixture
def own_dataset(tmp_path, sample_dataset):
    """A copy of the sample dataset the test may change (its pictures shared)."""
    database, tags = sample_dataset
    folder = tmp_path / "dataset"
    folder.mkdir()
    shutil.copy(database, folder / "dataset.sqlite")
    (folder / "images").symlink_to(database.parent / "images")
    return folder / "dataset.sqlite", tags


def tag_strings(database):
    with sqlite3.connect(database) as connection:
        return dict(connection.execute("SELECT id, tag_string FROM posts"))


def audited_project(tmp_path, own_dataset, flips=((0, 0), (3, 5), (7, 2), (10, 11))):
    """A project audited with scores that agree with every label but the `flips` (record, tag) pairs."""
    database, tags = own_dataset
    project = make_project(tmp_path / "project", database, tags)
    records = load_records(database, 1)
    given = given_matrix(records, tags)
    scores = np.where(given == 1, 0.95, 0.05)
    for row, column in flips:
        scores[row, column] = 1.0 - scores[row, column]
    lines = []
    # 24 posts are too few for the calibration to call any label more likely wrong than not: the rows are
    # the first len(flips) in its order.
    suggestions = finish(ProjectPaths(project), records, tags, np.arange(len(records)), scores,
                         list(range(len(tags))), "test scores", len(flips), lines.append)
    return project, records, suggestions, lines


def test_folds_are_balanced_fixed_by_seed_and_keep_groups_together(sample_dataset):
    records = load_records(sample_dataset[0], 1)
    folds = assign_folds(records, 3, seed=0)
    assert sorted(np.bincount(folds).tolist()) == [8, 8, 8]
    assert (assign_folds(records, 3, seed=0) == folds).all()
    assert not (assign_folds(records, 3, seed=1) == folds).all()
    from array import array
    from dataclasses import replace

    grouped = replace(records, split_ids=array("q", [1] * 6 + list(records.ids[6:])))
    grouped_folds = assign_folds(grouped, 3, seed=0)
    assert len(set(grouped_folds[:6].tolist())) == 1


@pytest.mark.parametrize("folds", [1, 25])
def test_folds_below_two_or_above_the_post_count_are_one_line(sample_dataset, folds):
    with pytest.raises(UserError, match=rf"--folds {folds}: must be at least 2 and at most the number of posts "
                                        r"\(24 eligible posts\)"):
        assign_folds(load_records(sample_dataset[0], 1), folds, seed=0)


def test_ranking_puts_flipped_labels_first():
    rng = np.random.default_rng(0)
    truth = rng.random((300, 6)) < 0.3
    flips = rng.random(truth.shape) < 0.05
    given = truth ^ flips
    scores = np.clip(truth * 0.8 + 0.1 + rng.normal(0, 0.1, truth.shape), 0, 1)
    ranking = rank_labels(given, scores)
    top = ranking.full_order()[:flips.sum()]
    assert flips[top[:, 0], top[:, 1]].mean() > 0.9
    flagged = ranking.order()
    assert len(flagged) > 0.8 * flips.sum() and flips[flagged[:, 0], flagged[:, 1]].mean() > 0.9


def test_ranking_starts_no_worker_processes(monkeypatch):
    # cleanlab's default forks a pool for every tag: minutes for a few thousand tags in a process holding
    # TensorFlow. The ranking must work with process pools out of reach, and flag the flipped label.
    import multiprocessing

    def refuse(*args, **kwargs):
        raise AssertionError("the ranking started a process pool")

    monkeypatch.setattr(multiprocessing, "Pool", refuse)
    given = np.zeros((40, 3), dtype=bool)
    given[:20, 0] = given[10:30, 1] = given[::2, 2] = True
    scores = np.where(given, 0.9, 0.1)
    scores[3, 0] = 0.02  # labelled, scored as absent
    ranking = rank_labels(given, scores)
    assert tuple(ranking.order()[0]) == (3, 0)


def test_audit_csv_lists_the_disagreements_with_their_record(tmp_path, own_dataset):
    project, records, suggestions, lines = audited_project(tmp_path, own_dataset)
    tags = own_dataset[1]
    with open(project / "audit.csv", newline="") as stream:
        rows = list(csv.reader(stream))
    assert tuple(rows[0]) == COLUMNS
    found = {(int(row[0]), row[2]) for row in rows[1:]}
    expected = {(records.ids[r], tags[c]) for r, c in ((0, 0), (3, 5), (7, 2), (10, 11))}
    assert found == expected
    for row in rows[1:]:
        post = records.ids.index(int(row[0]))
        carried = row[2] in records.tag_strings[post].split()
        assert row[3] == str(int(carried)) and row[5] == ("wrong" if carried else "missing")
        assert row[1] == records.md5s[post]
    assert [int(row[6]) for row in rows[1:]] == [1, 2, 3, 4]
    record = json.loads((project / "audit" / "audit.json").read_text())
    assert set(record["posts"]) == {str(post) for post, _ in expected}
    # Every row carries its probability, in audit.csv and audit.json alike, most likely a mistake first.
    probabilities = [float(row[7]) for row in rows[1:]]
    assert probabilities == sorted(probabilities, reverse=True) and all(0 < p < 1 for p in probabilities)
    assert [(r["post_id"], r["tag"], r["probability"]) for r in record["rows"]] == [
        (int(row[0]), row[2], float(row[7])) for row in rows[1:]]
    assert record["validation"][0]["model"] == "test scores" and record["validation"][0]["posts"] == 24
    assert record["estimated_errors"] > 0 and set(record["noise_rates"]) == {"missing", "wrong"}
    assert "4 suggestions" in lines[-2] and "label errors estimated" in lines[-2]


def test_apply_changes_the_posts_once_after_a_backup_that_restores_them(tmp_path, own_dataset, capsys):
    database = own_dataset[0]
    with sqlite3.connect(database) as connection:  # a hand edit before the audit, to keep
        connection.execute("UPDATE posts SET tag_string = tag_string || ' hand_made' WHERE id = 2")
    before = tag_strings(database)
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    accepted = tmp_path / "accepted.csv"
    text = (project / "audit.csv").read_text().splitlines()
    accepted.write_text("\n".join(text[:4]) + "\n")  # three of the four rows

    dry = apply_audit(project, accepted, dry_run=True, echo=print)
    assert tag_strings(database) == before and not (project / "audit" / "backups").exists()
    assert "Dry run: nothing was changed" in capsys.readouterr().out

    summary = apply_audit(project, accepted, echo=print)
    after = tag_strings(database)
    assert len(summary.changes) == len(dry.changes) == 3
    for suggestion in suggestions[:3]:
        present = suggestion.tag in after[suggestion.post_id].split()
        assert present == (suggestion.kind == "missing")
    assert {post for post in after if after[post] != before[post]} == {s.post_id for s in suggestions[:3]}
    assert "hand_made" in after[2]
    out = capsys.readouterr().out
    assert "changed 3 posts" in out and "Backup of the database" in out

    again = apply_audit(project, accepted, echo=print)
    assert again.changes == [] and again.in_effect == 3 and tag_strings(database) == after
    backups = sorted((project / "audit" / "backups").iterdir())
    assert len(backups) == 1  # nothing changed, nothing backed up
    shutil.copy(backups[0] / database.name, database)
    assert tag_strings(database) == before


def test_apply_refuses_rows_of_another_audit_and_posts_edited_since(tmp_path, own_dataset):
    database = own_dataset[0]
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    lines = (project / "audit.csv").read_text().splitlines()
    other = tmp_path / "other.csv"
    forged = lines[1].split(",")
    forged[1] = "0" * 32
    other.write_text(lines[0] + "\n" + ",".join(forged) + "\n")
    before = tag_strings(database)
    with pytest.raises(UserError, match=r"other.csv: line 2: post \d+ with md5 0{32} is not a suggestion of the audit"):
        apply_audit(project, other)
    unsuggested = lines[1].split(",")
    unsuggested[2], unsuggested[3], unsuggested[5] = "no_such_tag", "0", "missing"
    other.write_text(lines[0] + "\n" + ",".join(unsuggested) + "\n")
    with pytest.raises(UserError, match="missing tag 'no_such_tag'"):
        apply_audit(project, other)

    edited = suggestions[1].post_id
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE posts SET tag_string = tag_string || ' edited' WHERE id = ?", (edited,))
    accepted = tmp_path / "accepted.csv"
    accepted.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"1 post changed since the audit: {edited} \(tags\); run the audit again"):
        apply_audit(project, accepted)
    before[edited] += " edited"
    assert tag_strings(database) == before and not (project / "audit" / "backups").exists()


def test_apply_file_needs_audit_csv_columns(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("post_id,tag\n1,a\n")
    with pytest.raises(UserError, match="x.csv: header: must be post_id,md5,tag,given,score,kind,rank,probability"):
        read_suggestions(path)
    path.write_text(",".join(COLUMNS) + "\n1,abc,red,1,0.2,missing,1,0.7\n")
    with pytest.raises(UserError, match="line 2: given 1 with kind 'missing'"):
        read_suggestions(path)
    for score, rank, probability in (("nan", "1", "0.5"), ("7.5", "1", "0.5"), ("0.2", "-3", "0.5"),
                                     ("0.2", "0", "0.5"), ("0.2", "1", "1.5"), ("0.2", "1", "nan")):
        path.write_text(",".join(COLUMNS) + f"\n1,abc,red,1,{score},wrong,{rank},{probability}\n")
        with pytest.raises(UserError, match=rf"line 2: score {score} and probability {probability} must be numbers "
                                            rf"from 0 to 1 and rank {rank} a "):
            read_suggestions(path)
    path.write_text(",".join(COLUMNS) + "\n1,abc,red,1,0.2,wrong,1,0.25\n")
    assert read_suggestions(path)[0][1].probability == 0.25
    # A file of an audit from before the probability column reads as it did.
    path.write_text(",".join(COLUMNS[:-1]) + "\n1,abc,red,1,0.2,wrong,1\n")
    (line, row), = read_suggestions(path)
    assert (line, row.tag, row.given, row.score, row.rank, row.probability) == (2, "red", 1, 0.2, 1, None)


def test_apply_edits_the_caption_files_of_the_imported_pictures(tmp_path, own_dataset):
    database, tags = own_dataset
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    folder = tmp_path / "pictures"
    folder.mkdir()
    chosen = suggestions[:2]
    for suggestion in chosen:
        index = records.ids.index(suggestion.post_id)
        shutil.copy(records.path(index), folder / f"p{suggestion.post_id}.jpg")
        caption = ", ".join(records.tag_strings[index].split()).replace("_", " ")
        (folder / f"p{suggestion.post_id}.txt").write_text(caption + "\n")
    accepted = tmp_path / "accepted.csv"
    accepted.write_text("\n".join((project / "audit.csv").read_text().splitlines()) + "\n")
    summary = apply_audit(project, accepted, captions=folder)
    assert len(summary.captions) == 2 and len(summary.no_caption) == len(summary.changes) - 2
    from deepdanbooru.captions import parse_caption

    for suggestion in chosen:
        read = parse_caption((folder / f"p{suggestion.post_id}.txt").read_text())
        assert (suggestion.tag in read) == (suggestion.kind == "missing")
        saved = summary.backup / "captions" / f"p{suggestion.post_id}.txt"
        assert (suggestion.tag in parse_caption(saved.read_text())) == (suggestion.kind == "wrong")


@pytest.mark.parametrize("damage, field, problem", [
    (lambda record, post: record.pop("database"), "database", "missing or not a path"),
    (lambda record, post: post.update(tags=5), "posts.{post}", "tags: missing or not text"),
    (lambda record, post: post.update(suggested="two_shapes"), "posts.{post}", "suggested: missing or not a list"),
    (lambda record, post: post.pop("md5"), "posts.{post}", "md5: missing or not text"),
])
def test_a_damaged_audit_record_is_one_line_and_changes_nothing(tmp_path, own_dataset, damage, field, problem):
    database = own_dataset[0]
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    path = project / "audit" / "audit.json"
    record = json.loads(path.read_text())
    post = str(suggestions[0].post_id)
    damage(record, record["posts"][post])
    path.write_text(json.dumps(record))
    accepted = tmp_path / "accepted.csv"
    accepted.write_text((project / "audit.csv").read_text())
    before = tag_strings(database)
    with pytest.raises(UserError) as raised:
        apply_audit(project, accepted)
    assert str(raised.value).startswith(f"{path}: {field.format(post=post)}: {problem}")
    assert tag_strings(database) == before and not (project / "audit" / "backups").exists()


def _captions_for(tmp_path, records, suggestions):
    folder = tmp_path / "pictures"
    folder.mkdir()
    for suggestion in suggestions:
        index = records.ids.index(suggestion.post_id)
        shutil.copy(records.path(index), folder / f"p{suggestion.post_id}.jpg")
        (folder / f"p{suggestion.post_id}.txt").write_text(records.tag_strings[index].replace(" ", ", ") + "\n")
    return folder


def _contents(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_a_read_only_caption_file_stops_apply_before_anything_changes(tmp_path, own_dataset, monkeypatch):
    import deepdanbooru.audit.apply as apply_module

    database = own_dataset[0]
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    folder = _captions_for(tmp_path, records, suggestions[:2])
    accepted = tmp_path / "accepted.csv"
    accepted.write_text((project / "audit.csv").read_text())
    locked = folder / f"p{suggestions[1].post_id}.txt"
    real_access = apply_module.os.access
    monkeypatch.setattr(apply_module.os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    before, captions = tag_strings(database), _contents(folder)
    with pytest.raises(UserError) as raised:
        apply_audit(project, accepted, captions=folder)
    assert str(raised.value) == f"{locked}: cannot be written (read-only); nothing was changed"
    assert tag_strings(database) == before and _contents(folder) == captions
    assert not (project / "audit" / "backups").exists()


def test_a_failed_database_write_or_backup_leaves_no_backup_behind(tmp_path, own_dataset, monkeypatch):
    import deepdanbooru.audit.apply as apply_module
    from deepdanbooru.errors import DatasetError

    database = own_dataset[0]
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    accepted = tmp_path / "accepted.csv"
    accepted.write_text((project / "audit.csv").read_text())
    before = tag_strings(database)

    def refuse(database, changes):
        raise DatasetError(f"{database}: posts: cannot be written: attempt to write a readonly database")

    monkeypatch.setattr(apply_module, "_write", refuse)
    with pytest.raises(DatasetError, match="readonly database"):
        apply_audit(project, accepted)
    assert list((project / "audit" / "backups").iterdir()) == []
    monkeypatch.undo()

    folder = _captions_for(tmp_path, records, suggestions[:1])

    def full_disk(source, target):
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(apply_module.shutil, "copy2", full_disk)
    with pytest.raises(UserError) as raised:
        apply_audit(project, accepted, captions=folder)
    message = str(raised.value)
    assert "cannot write the backup (No space left on device); nothing was changed" in message
    assert message.startswith(str(project / "audit" / "backups")) and "\n" not in message
    assert list((project / "audit" / "backups").iterdir()) == [] and tag_strings(database) == before


@pytest.mark.parametrize("text, remove, add, expected", [
    ("a, b, long hair\n", ["b"], ["c"], "a, long hair, c\n"),
    ("x\ny\nz\n", ["y"], ["w"], "x\nz\nw\n"),
    ("(masterpiece:1.2), red", [], ["blue"], "(masterpiece:1.2), red, blue"),
    ("white background, red", ["red"], [], "white_background"),
    ("a b c", ["b"], [], "a c"),
    # Joined as the caption joins its own entries, and its spaced entries stay spaced.
    ("a,b,c", [], ["d"], "a,b,c,d"),
    ("a,b,c\n", ["b"], ["d"], "a,c,d\n"),
    ("x y z", ["y"], ["w"], "x z w"),
    ("black background, triangle", ["triangle"], ["two_shapes"], "black background, two shapes"),
    ("long_hair, smile", [], ["black_background"], "long_hair, smile, black_background"),
    ("solo", [], ["smile"], "solo, smile"),
    ("a,  b ,c", [], ["d"], "a,  b ,c, d"),  # nothing removed: the text to the character, then the new entry
])
def test_caption_edits_keep_the_other_entries_as_written(text, remove, add, expected):
    assert edit_caption(text, remove, add) == expected


@pytest.mark.parametrize("separator, text, expected", [
    # ',' (the commands' default) and ', ' are one separator: the caption's own spacing is kept.
    (",", "white background, long hair, b", "white background, long hair, c"),
    (",", "x,long_hair,b", "x,long_hair,c"),
    ("|", "a|long hair|b", "a|long hair|c"),
    (" | ", "a, x | long hair | b", "a, x | long hair | c"),
])
def test_caption_edits_read_and_write_the_folder_s_separator(separator, text, expected):
    from deepdanbooru.captions import parse_caption

    edited = edit_caption(text, ["b"], ["c"], separator)
    assert edited == expected
    assert parse_caption(edited, separator) == [tag for tag in parse_caption(text, separator) if tag != "b"] + ["c"]


def test_a_bad_caption_separator_for_apply_is_one_line():
    with pytest.raises(UserError, match="--caption-separator"):
        edit_caption("a, b", ["b"], [], "")


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.mark.parametrize("args, message", [
    (["--folds", "1"], "--folds 1: must be at least 2"),
    (["--folds", "99"], "--folds 99: must be at least 2 and at most the number of posts (24 eligible posts)"),
    ([], "give --folds K"),
    (["--folds", "2", "--model-path", "{folder}"], "(a model that never saw these posts), not both"),
    (["--dry-run"], "--dry-run and --captions go with --apply FILE"),
    (["--model-path", "{folder}"], "{folder}: --model-path folder is not a timm checkpoint"),
    (["--model-path", "{folder}/none.keras"], "Invalid value for '--model-path': Path '{folder}/none.keras' does not exist"),
    (["--folds", "2", "--min-probability", "1.5"], "Invalid value for '--min-probability': 1.5 is not in the range"),
    (["--apply", "{folder}/a.csv", "--min-probability", "0.3"], "it takes no --folds, --model-path, --time-limit, --top "
                                                                 "or --min-probability"),
])
def test_bad_audit_arguments_are_one_line_and_write_nothing(sample_project, tmp_path, args, message):
    folder = tmp_path / "not_a_checkpoint"
    folder.mkdir()
    args, message = [arg.format(folder=folder) for arg in args], message.format(folder=folder)
    result = invoke("audit", sample_project, *args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in sample_project.iterdir()) == ["project.json", "tags.txt"]


@pytest.mark.slow
def test_fold_audit_trains_through_train_project_resumes_and_a_model_path_audit_uses_a_fold_model(
        tmp_path, sample_dataset):
    database, tags = sample_dataset
    project = make_project(tmp_path / "project", database, tags, epoch_count=1, checkpoint_frequency_mb=100,
                           image_width=16, image_height=16)
    result = invoke("audit", project, "--folds", 2)
    assert result.exit_code == 0, result.output
    assert "Audit: fold 1 of 2: training on 12 posts, then scoring the 12 it does not see" in result.output
    assert "time left for the audit: about" in result.output
    folds = sorted((project / "audit" / "folds").iterdir())
    for fold in folds:  # an ordinary project, trained by train-project on the other fold's posts
        assert (fold / "model-resnet_small.keras").is_file() and (fold / "checkpoints" / "state.json").is_file()
        trained = set(load_records(fold / "posts.sqlite", 1).ids)
        with np.load(fold / "scores.npz") as saved:
            scored = set(saved["ids"].tolist())
        assert len(trained) == len(scored) == 12 and not trained & scored
    with open(project / "audit.csv", newline="") as stream:
        assert tuple(next(csv.reader(stream))) == COLUMNS

    record = json.loads((project / "audit" / "audit.json").read_text())
    assert [figures["model"] for figures in record["validation"]] == ["fold 1 of 2", "fold 2 of 2"]
    for figures in record["validation"]:
        assert figures["posts"] == 12 and figures["trained"]["epochs"] == 1 and not figures["trained"]["stopped"]
    assert "Audit: fold 1 of 2 trained 1 epoch (its plan done)" in result.output
    fold_config = json.loads((folds[0] / "project.json").read_text())
    assert fold_config["validation_fraction"] == 0.0  # the fold it scores is its validation

    again = invoke("audit", project, "--folds", 2)
    assert again.exit_code == 0 and "2 of 2 folds already scored" in again.output
    assert "Training" not in again.output

    # A tag put first in tags.txt after the folds were scored would shift every score to the next tag's name.
    before = {path: path.read_bytes() for path in (project / "audit").rglob("*") if path.is_file()}
    (project / "tags.txt").write_text("\n".join(["new_first", *tags]) + "\n")
    shifted = invoke("audit", project, "--folds", 2)
    assert shifted.exit_code != 0 and "Traceback" not in shifted.output
    assert f"{project / 'tags.txt'}: is not the tags.txt the folds' models were trained with" in shifted.output
    assert "added: new_first" in shifted.output
    assert {path: path.read_bytes() for path in (project / "audit").rglob("*") if path.is_file()} == before

    other = make_project(tmp_path / "other", database, tags, image_width=16, image_height=16)
    model = folds[0] / "model-resnet_small.keras"
    by_model = invoke("audit", other, "--model-path", model)
    assert by_model.exit_code == 0, by_model.output
    assert f"knows {len(tags)} of the {len(tags)} tags" in by_model.output
    assert (other / "audit.csv").is_file()

    strangers = make_project(tmp_path / "strangers", database, ["nothing_shared", "at_all"])
    refused = invoke("audit", strangers, "--model-path", model)
    assert refused.exit_code != 0 and "is a tag of tags.txt" in refused.output
    assert sorted(p.name for p in strangers.iterdir()) == ["project.json", "tags.txt"]


@pytest.mark.slow
def test_audit_page_accepts_rejects_and_exports_rows_that_apply(tmp_path, own_dataset):
    project, records, suggestions, _ = audited_project(tmp_path, own_dataset)
    with open_page(project / "audit.html", width=900, height=700, accept_downloads=True) as visit:
        check_audit_page(visit, project, tmp_path)
    summary = apply_audit(project, tmp_path / "exported.csv")
    assert sorted(change.post_id for change in summary.changes) == sorted(
        {suggestions[0].post_id, suggestions[2].post_id})


def check_audit_page(visit, project, tmp_path):
    page = visit.page
    rows = page.locator("tbody tr")
    assert rows.count() == 4
    assert page.locator("tbody img").count() == 4  # every thumbnail inlined
    assert "0 accepted, 0 rejected, 4 undecided" in page.inner_text("#counts")
    rows.nth(0).locator("button[value=accepted]").click()
    rows.nth(1).locator("button[value=rejected]").click()
    rows.nth(2).locator("button[value=accepted]").click()
    assert "2 accepted, 1 rejected, 1 undecided" in page.inner_text("#counts")
    page.screenshot(path=str(tmp_path / "audit.png"))
    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "exported.csv"
    download.value.save_as(exported)
    lines = (project / "audit.csv").read_text().splitlines()
    assert exported.read_text() == "\n".join([lines[0], lines[1], lines[3]]) + "\n"

    page.reload()  # decisions survive a reload
    assert "2 accepted, 1 rejected, 1 undecided" in page.inner_text("#counts")
    assert visit.console_errors == [] and visit.page_errors == []
    assert visit.network_requests == [], visit.network_requests


def test_the_ranking_needs_no_cleanlab(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cleanlab", None)  # import cleanlab then fails
    given = np.zeros((40, 3), dtype=bool)
    given[:20, 0] = given[10:30, 1] = given[::2, 2] = True
    scores = np.where(given, 0.9, 0.1)
    scores[3, 0] = 0.02
    assert tuple(rank_labels(given, scores).full_order()[0]) == (3, 0)


RECORD = {"estimated_errors": 41.6, "skipped_tags": [{"tag": "phone", "carriers": 3, "auc": 0.13}],
          "validation": [{"model": "/models/fold-1", "posts": 600, "map": 0.2012, "mean_auc": 0.71},
                         {"model": "/models/fold-2", "posts": 600, "map": None, "mean_auc": 0.8}],
          "warnings": ["the scoring models are too weak for their suggestions to mean much <fold-1>"]}


def synthetic_page(tmp_path, count=130, probability=True, record=None):
    """audit.html for `count` rows over three tags (no pictures), written by the page's own builder."""
    from dataclasses import dataclass

    from deepdanbooru.audit.page import page_html
    from deepdanbooru.audit.results import Suggestion

    @dataclass(frozen=True)
    class Row(Suggestion):
        probability: float = 0.0

    rng = np.random.default_rng(0)
    rows = []
    for rank in range(1, count + 1):
        given = int(rank % 3 == 0)
        score = 0.13 if rank == 2 else float(rng.random())
        rows.append(Row(1000 + rank // 2, f"{rank:032x}", ["cat", "dog", "travel_&_places"][rank % 4 % 3], given,
                        score, rank, round(1 - rank / (count + 1), 4)))
    if not probability:
        rows = [Suggestion(r.post_id, r.md5, r.tag, r.given, r.score, r.rank) for r in rows]
    path = tmp_path / "audit.html"
    path.write_text(page_html("audit", rows, {}, {r.post_id: "some tags" for r in rows}, f"test:{probability}",
                              "project", record), encoding="utf-8")
    return path, rows


def shown_ranks(page):
    return [int(rank) for rank in page.eval_on_selector_all("tbody tr", "rows => rows.map(r => r.dataset.rank)")]


def every_page(page):
    ranks = shown_ranks(page)
    while not page.is_disabled("#next"):
        page.click("#next")
        ranks += shown_ranks(page)
    return ranks


def test_audit_page_filters_and_pages_reach_every_row_and_export_the_accepted(tmp_path):
    from deepdanbooru.audit.page import PAGE_ROWS

    path, rows = synthetic_page(tmp_path, record=RECORD)
    with open_page(path, width=1100, height=800, accept_downloads=True) as visit:
        page = visit.page
        # What the audit found about itself, and its warnings, above the rows.
        assert ("About 42 label errors estimated over the audited tags. fold-1: mAP 0.20, mean AUC 0.71 on the 600 "
                "posts it did not see. fold-2: mAP \u2013, mean AUC 0.80 on the 600 posts it did not see. 1 tag not "
                "audited") in page.inner_text("body")
        assert page.inner_text(".warning") == ("warning: the scoring models are too weak for their suggestions to "
                                               "mean much <fold-1>")
        assert len(shown_ranks(page)) == PAGE_ROWS < len(rows)
        assert every_page(page) == [row.rank for row in rows]  # nothing cut: every row, in rank order
        assert "page 3 of 3" in page.inner_text("#shown")
        page.fill("#page-number", "2")  # a page by its number
        page.press("#page-number", "Enter")
        assert shown_ranks(page) == [row.rank for row in rows[PAGE_ROWS:2 * PAGE_ROWS]]
        page.fill("#page-number", "99")  # past the last: the last
        page.press("#page-number", "Enter")
        assert "page 3 of 3" in page.inner_text("#shown") and page.input_value("#page-number") == "3"
        # The wording holds what the figure says, no more.
        page.select_option("#filter-kind", "missing")
        second = page.locator('tbody tr[data-rank="2"] td.suggestion').inner_text()
        assert "add travel_&_places" in second.replace("\n", " ") and "the post lacks it; the model gives 0.13" in second
        assert "likely" not in page.inner_text("body")
        assert page.locator("thead th").all_inner_texts()[4] == "probability wrong"
        # Each filter keeps exactly its rows, over every page.
        assert every_page(page) == [row.rank for row in rows if not row.given]
        page.select_option("#filter-kind", "wrong")
        assert every_page(page) == [row.rank for row in rows if row.given]
        assert page.locator("tbody td.suggestion.missing").count() == 0
        page.select_option("#filter-kind", "")
        page.select_option("#filter-tag", label=f"travel_&_places ({sum(r.tag == 'travel_&_places' for r in rows)})")
        assert every_page(page) == [row.rank for row in rows if row.tag == "travel_&_places"]
        page.select_option("#filter-tag", "")
        page.fill("#filter-least", "0.6")
        kept = [row.rank for row in rows if row.probability >= 0.6]
        assert every_page(page) == kept and len(kept) < len(rows)
        # Accepting "the undecided the filters keep" accepts those rows only, across their pages.
        page.select_option("#filter-kind", "wrong")
        page.click("#accept-rest")
        accepted = [row.rank for row in rows if row.probability >= 0.6 and row.given]
        assert f"{len(accepted)} accepted, 0 rejected" in page.inner_text("#counts")
        page.fill("#filter-least", "0")
        page.select_option("#filter-kind", "")
        page.locator('tbody tr[data-rank="1"] button[value=rejected]').click()
        page.select_option("#filter-decision", "undecided")
        assert every_page(page) == [r.rank for r in rows if r.rank not in accepted and r.rank != 1]
        page.select_option("#filter-decision", "")
        page.screenshot(path=str(tmp_path / "audit.png"))
        with page.expect_download() as download:
            page.click("#export")
        exported = tmp_path / "exported.csv"
        download.value.save_as(exported)
        assert [int(row.rank) for _, row in read_suggestions(exported)] == accepted
        assert visit.console_errors == [] and visit.page_errors == [] and visit.network_requests == []


def test_audit_page_without_probabilities_filters_on_the_score_against_the_label(tmp_path):
    path, rows = synthetic_page(tmp_path, count=40, probability=False)
    with open_page(path) as visit:
        page = visit.page
        assert page.locator(".warning").count() == 0 and "label errors estimated" not in page.inner_text("body")
        assert "probability wrong" not in page.inner_text("thead")
        assert "the model's score against the label at least" in page.inner_text(".bar")
        page.fill("#filter-least", "0.7")
        against = [row.rank for row in rows if (1 - row.score if row.given else row.score) >= 0.7]
        assert every_page(page) == against
        assert visit.console_errors == [] and visit.page_errors == []


def recorded_audit(tmp_path, own_dataset, chosen):
    """A project whose audit record holds the `chosen` (record index, tag, given) rows (no ranking involved)."""
    from deepdanbooru.audit.results import Suggestion, write_results

    database, tags = own_dataset
    project = make_project(tmp_path / "project", database, tags)
    records = load_records(database, 1)
    rows = [Suggestion(records.ids[index], records.md5s[index], tag, given, 0.5, rank)
            for rank, (index, tag, given) in enumerate(chosen, start=1)]
    posts = {records.ids[index]: {"md5": records.md5s[index], "tags": records.tag_strings[index]}
             for index, _, _ in chosen}
    write_results(project, rows, posts, database, "test", list(tags))
    return project, records, rows


def carried_and_lacked(records, tags, index):
    carried = records.tag_strings[index].split()
    return carried[0], next(tag for tag in tags if tag not in carried)


def caption_folder(tmp_path, records, indices, text_of):
    folder = tmp_path / "pictures"
    folder.mkdir(exist_ok=True)
    for index in indices:
        shutil.copy(records.path(index), folder / f"p{records.ids[index]}.jpg")
        (folder / f"p{records.ids[index]}.txt").write_text(text_of(index))
    return folder


def test_a_dry_run_lists_each_change_with_its_caption_file_before_the_totals(tmp_path, own_dataset):
    database, tags = own_dataset
    records = load_records(database, 1)
    wrong, missing = carried_and_lacked(records, tags, 0)
    other_wrong, _ = carried_and_lacked(records, tags, 1)
    project, records, rows = recorded_audit(tmp_path, own_dataset, [(0, wrong, 1), (0, missing, 0), (1, other_wrong, 1)])
    folder = caption_folder(tmp_path, records, [0], lambda index: ", ".join(records.tag_strings[index].split()))
    (project / "accepted.csv").write_text((project / "audit.csv").read_text())
    before, captions_before = tag_strings(database), _contents(folder)
    lines = []
    apply_audit(project, project / "accepted.csv", dry_run=True, captions=folder, echo=lines.append)
    first, second = records.ids[0], records.ids[1]
    caption = folder / f"p{first}.txt"
    assert lines[:3] == [f"post {first}: remove {wrong}; caption {caption}",
                         f"post {first}: add {missing}; caption {caption}",
                         f"post {second}: remove {other_wrong}; no caption file"]
    assert "would change 2 posts (1 tag added, 2 removed)" in lines[3]
    assert lines[-1] == "Dry run: nothing was changed"
    assert tag_strings(database) == before and _contents(folder) == captions_before


def test_a_second_apply_with_captions_brings_the_captions_in_line_with_the_database(tmp_path, own_dataset):
    from deepdanbooru.captions import parse_caption

    database, tags = own_dataset
    records = load_records(database, 1)
    wrong, missing = carried_and_lacked(records, tags, 0)
    project, records, rows = recorded_audit(tmp_path, own_dataset, [(0, wrong, 1), (0, missing, 0)])
    accepted = project / "accepted.csv"
    accepted.write_text((project / "audit.csv").read_text())
    apply_audit(project, accepted, echo=lambda line: None)  # the database only: its captions were forgotten
    after = tag_strings(database)
    folder = caption_folder(tmp_path, records, [0], lambda index: ", ".join(records.tag_strings[index].split()))
    caption = folder / f"p{records.ids[0]}.txt"
    dry = invoke("audit", project, "--apply", accepted, "--dry-run", "--captions", folder)
    assert dry.exit_code == 0, dry.output
    assert dry.output.splitlines()[:2] == [f"post {records.ids[0]}: remove {wrong}; the post already lacks it; "
                                           f"caption {caption}",
                                           f"post {records.ids[0]}: add {missing}; the post already has it; "
                                           f"caption {caption}"]
    assert "would change 0 posts" in dry.output and "Caption files: would change 1" in dry.output
    lines = []
    summary = apply_audit(project, accepted, captions=folder, echo=lines.append)
    assert summary.changes == [] and summary.in_effect == 2 and tag_strings(database) == after
    read = parse_caption((folder / f"p{records.ids[0]}.txt").read_text())
    assert missing in read and wrong not in read
    assert summary.captions == [folder / f"p{records.ids[0]}.txt"]
    assert any(line.startswith("Caption files: changed 1") for line in lines)
    # Its backup holds the caption as it was, though the database did not change.
    saved = summary.backup / "captions" / f"p{records.ids[0]}.txt"
    assert wrong in parse_caption(saved.read_text())
    third = apply_audit(project, accepted, captions=folder, echo=lambda line: None)
    assert third.captions == [] and third.backup is None


def test_caption_edits_follow_the_folder_s_spelling_of_multi_word_tags(tmp_path, own_dataset):
    database, tags = own_dataset
    records = load_records(database, 1)
    _, missing = carried_and_lacked(records, tags, 0)
    project, records, rows = recorded_audit(tmp_path, own_dataset, [(0, "travel_&_places", 0), (0, missing, 0)])
    # The post's own caption holds no multi-word tag; the folder's others write them with spaces.
    folder = caption_folder(tmp_path, records, [0], lambda index: "smile, cat")
    (folder / "other.txt").write_text("travel & places, smiling face, cat\n")
    (folder / "other.png").write_bytes(b"not read")
    from deepdanbooru.audit.results import write_results

    write_results(project, rows, {records.ids[0]: {"md5": records.md5s[0], "tags": records.tag_strings[0]}},
                  database, "test", list(tags) + ["travel_&_places"])
    (project / "accepted.csv").write_text((project / "audit.csv").read_text())
    apply_audit(project, project / "accepted.csv", captions=folder, echo=lambda line: None)
    assert (folder / f"p{records.ids[0]}.txt").read_text() == f"smile, cat, travel & places, {missing.replace('_', ' ')}"


@pytest.mark.parametrize("text, folder, expected", [
    ("smile, cat", True, "smile, cat, travel & places"),
    ("smile, cat", False, "smile, cat, travel_&_places"),
    ("smile, cat", None, "smile, cat, travel_&_places"),
    ("long_hair, cat", True, "long_hair, cat, travel_&_places"),  # the caption's own spelling first
    ("long hair, cat", False, "long hair, cat, travel & places"),
])
def test_a_caption_without_a_multi_word_entry_takes_the_folder_s_spelling(text, folder, expected):
    assert edit_caption(text, [], ["travel_&_places"], folder_spaced=folder) == expected


def test_fold_state_records_the_tags_and_split_and_a_change_is_one_line(tmp_path, sample_dataset):
    from deepdanbooru.audit.folds import STATE_FILE, prepare_folds
    from deepdanbooru.errors import TrainingError

    records = load_records(sample_dataset[0], 1)
    tags = list(sample_dataset[1])
    audit_dir, tags_path = tmp_path / "audit", tmp_path / "tags.txt"
    fold_of = assign_folds(records, 3, seed=0)
    prepare_folds(audit_dir, records, 3, 0, tags, fold_of, tags_path)
    state = json.loads((audit_dir / STATE_FILE).read_text())
    assert state["tags"] == tags
    assert [sorted(ids) for ids in state["split"]] == [
        sorted(np.asarray(records.ids)[fold_of == index].tolist()) for index in range(3)]
    written = (audit_dir / STATE_FILE).read_bytes()
    for changed, says in ((["new_first"] + tags, "added: new_first"), (tags[1:], f"removed: {tags[0]}"),
                          (tags[::-1], "the same tags in another order")):
        with pytest.raises(TrainingError) as refused:
            prepare_folds(audit_dir, records, 3, 0, changed, fold_of, tags_path)
        line = str(refused.value)
        assert line.startswith(f"{tags_path}: is not the tags.txt the folds' models were trained with")
        assert says in line and "\n" not in line and f"delete {audit_dir / 'folds'}" in line
        assert (audit_dir / STATE_FILE).read_bytes() == written
    with pytest.raises(TrainingError, match=r"an audit with --folds 3 is under way; .* give --folds 3 to finish it"):
        prepare_folds(audit_dir, records, 2, 0, tags, assign_folds(records, 2, seed=0), tags_path)
    with pytest.raises(TrainingError, match=r"the posts \(their ids, tags or split\) or the project's seed changed"):
        prepare_folds(audit_dir, records, 3, 1, tags, assign_folds(records, 3, seed=1), tags_path)
    # Relabelled posts in the same folds (as after --apply): no fold model saw a post it would score.
    relabelled = dataclasses.replace(records, tag_strings=[records.tag_strings[0] + " extra"] + records.tag_strings[1:])
    with pytest.raises(TrainingError) as refused:
        prepare_folds(audit_dir, relabelled, 3, 0, tags, fold_of, tags_path)
    assert str(refused.value).startswith(f"{audit_dir / STATE_FILE}: the posts' tags changed since the folds were made")
    assert "may have trained on a post" not in str(refused.value)
    assert (audit_dir / STATE_FILE).read_bytes() == written


def test_a_fold_stopped_by_the_time_limit_says_how_far_it_trained_in_the_audits_words():
    from types import SimpleNamespace

    from deepdanbooru.audit.folds import TrainingWatch, describe_training, short_training

    lines = []
    watch = TrainingWatch(lines.append)
    watch("Epoch 1/200")
    watch('Validation: off. To measure the model on held-out records, set "validation_fraction": 0.05 in p.json')
    watch("Stopped for the time limit after 1m30s at epoch 2/200, record 5/40, step 9: ckpt and model.keras are "
          "written. To continue from there, run train-project again, e.g. deepdanbooru train-project fold")
    # The trainer's advice does not apply to a fold.
    assert lines == ["Epoch 1/200", "Validation: the fold's own posts, scored after training (it trains on all the "
                                    "others)"]
    trained = watch.trained(SimpleNamespace(used_epoch=1, offset=10), 40, 90.0)
    assert trained == {"epochs": 1.25, "planned": 200, "stopped": True, "seconds": 90.0}
    assert describe_training("fold 1 of 3", trained) == (
        "fold 1 of 3 trained 1.25 of 200 epochs (stopped by --time-limit after 1m30s)")
    assert short_training(trained)
    done = TrainingWatch(lines.append).trained(SimpleNamespace(used_epoch=3, offset=0), 40, 12.0)
    assert done == {"epochs": 3.0, "planned": 3, "stopped": False, "seconds": 12.0}
    assert describe_training("fold 2 of 3", done) == "fold 2 of 3 trained 3 epochs (its plan done)"
    assert not short_training(done)


def noisy_case(posts=1200, tags=8, seed=0):
    """Labels with known mistakes and scores from a model that knows tags 0..5 well and tags 6, 7 not at all."""
    rng = np.random.default_rng(seed)
    truth = rng.random((posts, tags)) < np.linspace(0.1, 0.4, tags)
    flips = (rng.random(truth.shape) < 0.03) & (truth | (rng.random(truth.shape) < 0.1))
    given = truth ^ flips
    logits = np.where(truth, 2.5, -2.5) + rng.normal(0, 1.2, truth.shape)
    logits[:, 6:] = rng.normal(-1, 1, (posts, tags - 6))  # a tag the model does not know: no separation
    return given, 1 / (1 + np.exp(-logits)), flips


def test_probability_ranks_mistakes_first_skips_tags_that_do_not_separate_and_counts_the_errors():
    given, scores, flips = noisy_case()
    ranking = rank_labels(given, scores)
    assert ranking.audited.tolist() == [True] * 6 + [False] * 2
    assert np.all(ranking.auc[6:] < 0.6) and np.all(ranking.auc[:6] > 0.9)
    assert np.all(ranking.probability[:, 6:] == 0) and np.all((ranking.probability >= 0) & (ranking.probability <= 1))
    known = flips[:, :6]
    top = ranking.full_order()[:int(known.sum())]
    assert set(top[:, 1].tolist()) <= set(range(6)) and known[top[:, 0], top[:, 1]].mean() > 0.7
    # The estimate is of the right size, and a label called likely wrong mostly is.
    assert 0.5 * known.sum() < ranking.estimated_errors < 1.5 * known.sum()
    sure = ranking.probability >= 0.5
    assert flips[sure].mean() > 0.6


def test_the_default_list_stops_at_one_half_or_the_estimated_errors_and_top_and_min_probability_change_it():
    given, scores, _ = noisy_case()
    ranking = rank_labels(given, scores)
    probability = lambda rows: ranking.probability[rows[:, 0], rows[:, 1]]  # noqa: E731
    default = ranking.order()
    assert len(default) <= round(ranking.estimated_errors) and probability(default).min() >= 0.5
    above_half = int((ranking.probability >= 0.5).sum())
    assert len(default) == min(above_half, round(ranking.estimated_errors))
    assert len(ranking.order(top=7)) == 7 and probability(ranking.order(top=7)).tolist() == sorted(
        probability(ranking.order(top=7)), reverse=True)
    assert len(ranking.order(top=5000)) == 5000  # --top alone: no floor
    loose = ranking.order(min_probability=0.2)
    assert len(loose) == int((ranking.probability >= 0.2).sum()) and probability(loose).min() >= 0.2
    assert len(ranking.order(top=3, min_probability=0.2)) == 3
    assert len(ranking.order(min_probability=0.5)) == above_half  # a floor given: no cap


def test_the_summary_names_unaudited_tags_each_models_figures_and_says_when_they_are_too_weak(tmp_path, own_dataset):
    from deepdanbooru.audit.summary import skipped_line, skipped_tags, too_weak, validation_figures

    given, scores, _ = noisy_case()
    names = [f"tag{i}" for i in range(8)]
    ranking = rank_labels(given, scores)
    skipped = skipped_tags(ranking, names)
    assert sorted(item["tag"] for item in skipped) == ["tag6", "tag7"]
    line = skipped_line(skipped)
    assert line.startswith("Not audited: 2 tags whose out-of-sample scores cannot separate") and "tag6 (AUC 0." in line
    strong = validation_figures("fold 1 of 2", given[:, :6], scores[:, :6])
    assert strong["posts"] == 1200 and strong["map"] > 0.8 and strong["mean_auc"] > 0.95
    weak = validation_figures("fold 2 of 2", given[:, 6:], scores[:, 6:])
    assert too_weak([strong]) is None
    warning = too_weak([strong, weak])
    assert (strong["tags_judged"], strong["tags_separated"]) == (6, 6)
    assert (weak["tags_judged"], weak["tags_separated"]) == (2, 0)
    assert warning.startswith("the scoring models are too weak for their suggestions to mean much: on the posts they "
                              "did not see, fold 2 of 2 separates 0 of the 2 tags it can be judged on (mAP")
    assert "fold 1 of 2" not in warning

    # finish() writes them into audit.json and says them, a short fold's advice included.
    database, tags = own_dataset
    project = make_project(tmp_path / "project", database, tags)
    records = load_records(database, 1)
    given = given_matrix(records, tags)
    rng = np.random.default_rng(1)
    scores = rng.random(given.shape)  # a model that knows nothing
    halves = [np.arange(12), np.arange(12, 24)]
    trained = {"epochs": 1.0, "planned": 200, "stopped": True, "seconds": 60.0}
    groups = [{"model": f"fold {i + 1} of 2", "posts": half, "trained": trained} for i, half in enumerate(halves)]
    lines = []
    suggestions = finish(ProjectPaths(project), records, tags, np.arange(24), scores, list(range(len(tags))),
                         "2-fold models", None, lines.append, groups=groups)
    record = json.loads((project / "audit" / "audit.json").read_text())
    assert [figures["model"] for figures in record["validation"]] == ["fold 1 of 2", "fold 2 of 2"]
    assert record["validation"][0]["trained"] == trained and record["validation"][0]["posts"] == 12
    assert record["skipped_tags"] and all(set(item) == {"tag", "carriers", "without", "auc"}
                                          for item in record["skipped_tags"])
    text = "\n".join(lines)
    assert "fold 1 of 2: mAP" in text and "it trained 1 of 200 epochs (stopped by --time-limit after 1m00s)" in text
    assert ("warning: fold 1 of 2, fold 2 of 2 stopped by --time-limit before half the epochs planned: their scores "
            "are from models far from trained") in text
    assert "run train-project again" not in text and "fold-*/scores.npz and run the audit again" in text
    assert "warning: the scoring models are too weak" in text and "Not audited:" in text
    assert suggestions == [] and "0 suggestions" in lines[-2]


def test_the_other_tags_vote_for_a_tag_the_look_alikes_carry_leaving_the_label_itself_out(monkeypatch):
    from deepdanbooru.audit import cooccurrence

    # Four drawings of each of three subjects, tags a b c / d e f / a d g; drawing 1 lacks c, drawing 5
    # carries an e its look-alikes lack.
    subjects = [[1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0], [1, 0, 0, 1, 0, 0, 1]]
    tags = np.array([subjects[i // 4] for i in range(12)], dtype=np.int8)
    tags[1, 2] = 0
    tags[9, 4] = 1
    votes = cooccurrence.tag_votes(tags, [2, 4])
    assert votes[1, 0] > 0.9  # c: its three look-alikes carry it
    assert 0.6 < votes[0, 0] < 0.7  # two of its three look-alikes carry c (drawing 1 lacks it)
    assert votes[9, 1] < 0.1 and votes[5, 1] > 0.9  # e: only drawing 9 of its subject carries it
    assert votes[8, 0] < 0.1
    # Blocks and a reference sample give the same votes where the sample holds every post.
    monkeypatch.setattr(cooccurrence, "BLOCK", 5)
    assert np.allclose(cooccurrence.tag_votes(tags, [2, 4]), votes)
    # A post never votes on itself: one post alone leans to the tag's frequency.
    alone = cooccurrence.tag_votes(np.array([[1, 1], [0, 0]]), [0])
    assert 0.3 < alone[0, 0] < 0.7


def test_the_other_tags_lift_a_mistake_the_scores_alone_leave_unsure():
    rng = np.random.default_rng(3)
    subjects = rng.random((60, 40)) < 0.12
    tags = np.repeat(subjects, 4, axis=0)  # four drawings a subject, same tags
    truth = tags.copy()
    given = truth.copy()
    given[10, 3] = not given[10, 3]
    given[21, 5] = not given[21, 5]
    logits = np.where(truth, 1.5, -1.5) + rng.normal(0, 1.0, truth.shape)  # a middling model
    scores = 1 / (1 + np.exp(-logits))
    from deepdanbooru.audit.cooccurrence import tag_votes

    votes = tag_votes(given, list(range(40)))
    alone = rank_labels(given, scores)
    both = rank_labels(given, scores, votes)
    assert alone.probability[21, 5] < 0.5 < both.probability[21, 5]  # the score alone (0.21) leaves it unsure
    top = both.full_order()[:2]
    assert {tuple(pair) for pair in top.tolist()} == {(10, 3), (21, 5)}


@pytest.mark.slow  # alone, about 20 s: importing TensorFlow (the fold road's imports); no training
def test_a_fine_tuned_projects_folds_warn_that_the_sources_posts_are_seen_by_every_fold(sample_project, monkeypatch):
    import deepdanbooru.project.resume as resume
    import deepdanbooru.training.train as train
    from deepdanbooru.audit.main import run_audit

    class Stop(Exception):
        pass

    def no_training(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(resume, "fine_tuned_network", lambda checkpoints: {"source": "/models/source.keras"})
    monkeypatch.setattr(train, "train_project", no_training)
    lines = []
    with pytest.raises(Stop):
        run_audit(sample_project, folds=2, echo=lines.append)
    warning = next(line for line in lines if line.startswith("warning:"))
    assert warning == ("warning: every fold starts from /models/source.keras, so a post that model was trained on is "
                       "seen by every fold, not unseen: if it was trained on this database, those posts' labels score "
                       "as it learnt them; audit with --model-path of a model that never saw these posts instead")


def test_the_platt_fit_moves_a_bounded_step_on_a_tag_its_features_decide():
    from deepdanbooru.audit.ranking import MAX_STEP, fit_platt

    # Perfectly separated: the likelihood alone would send the slope off to infinity in one Newton step.
    x = np.concatenate([np.linspace(-6, -1, 50), np.linspace(1, 6, 50)])[:, None, None]
    targets = (x[:, :, 0] > 0).astype(float)
    start = np.array([[0.0, 0.0]])
    one = fit_platt(targets, x, start=start, rounds=1)
    assert np.all(np.abs(one - start) <= MAX_STEP + 1e-12)
    many = fit_platt(targets, x, start=start, rounds=200)
    assert np.all(np.isfinite(many)) and many[0, 0] > 1  # the prior keeps it finite, the data steep
