"""The audit's own files when they are damaged or half-written: one line naming the file, never a traceback."""

import numpy as np
import pytest

from deepdanbooru.audit.folds import Fold, read_fold_scores, write_fold_scores
from deepdanbooru.errors import UserError


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_fold_scores_file_is_one_line_naming_it(tmp_path, damage):
    fold = Fold(0, 3, tmp_path / "fold-1-of-3")
    fold.directory.mkdir()
    write_fold_scores(fold, [1, 2, 3], np.full((3, 4), 0.5), {"epochs": 1.0})
    data = fold.scores.read_bytes()
    fold.scores.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"")
    with pytest.raises(UserError) as caught:
        read_fold_scores(fold)
    assert str(fold.scores) in str(caught.value)
    assert "delete it and run the audit again" in str(caught.value)


def test_fold_scores_read_back_as_written(tmp_path):
    fold = Fold(1, 3, tmp_path / "fold-2-of-3")
    fold.directory.mkdir()
    write_fold_scores(fold, [7, 9], np.array([[0.25, 0.75], [1.0, 0.0]]), {"epochs": 2.5, "stopped": True})
    saved = read_fold_scores(fold)
    assert saved.ids.tolist() == [7, 9]
    assert saved.scores.tolist() == [[0.25, 0.75], [1.0, 0.0]]
    assert saved.trained == {"epochs": 2.5, "stopped": True}


@pytest.mark.parametrize("estimated, said", [(1.2, "About 1 label error estimated"), (0.9, "About 1 label error "),
                                             (2.6, "About 3 label errors"), (1234.4, "About 1,234 label errors")])
def test_the_page_counts_the_estimated_errors_as_the_command_line_does(estimated, said):
    from deepdanbooru.audit.page import audit_notes

    notes, warnings = audit_notes({"estimated_errors": estimated})
    assert notes[0].startswith(said)
    assert warnings == []


def test_an_audit_stopped_while_saving_its_scores_leaves_the_last_scores_whole(tmp_path, sample_dataset, monkeypatch):
    from deepdanbooru.audit.main import finish, given_matrix
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.project.paths import ProjectPaths
    from train_helpers import make_project

    database, tags = sample_dataset
    project = make_project(tmp_path / "project", database, tags)
    records = load_records(database, 1)
    given = given_matrix(records, tags)
    scores = np.where(given == 1, 0.9, 0.1)
    finish(ProjectPaths(project), records, tags, np.arange(len(records)), scores, list(range(len(tags))),
           "test scores", None, lambda line: None)
    saved = project / "audit" / "scores.npz"
    before = saved.read_bytes()

    real = np.lib.format.write_array
    written = []

    def interrupted(*args, **kwargs):  # Ctrl-C after the first array went in
        if written:
            raise KeyboardInterrupt
        written.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finish(ProjectPaths(project), records, tags, np.arange(len(records)), 1.0 - scores, list(range(len(tags))),
               "test scores", None, lambda line: None)
    assert saved.read_bytes() == before
    assert sorted(path.name for path in saved.parent.iterdir()) == ["audit.json", "scores.npz"]


def test_a_tag_skipped_for_too_few_posts_without_it_is_not_named_by_a_good_auc():
    # 40 posts: tag 0 carried by all but 2 and scored perfectly (AUC 1.0), tag 1 carried by 20 with useless scores.
    from deepdanbooru.audit.ranking import rank_labels
    from deepdanbooru.audit.summary import skipped_line, skipped_tags

    given = np.zeros((40, 2), dtype=int)
    given[2:, 0] = 1
    given[:20, 1] = 1
    scores = np.column_stack([given[:, 0] * 0.8 + 0.1, np.full(40, 0.5)])
    ranking = rank_labels(given, scores)
    assert not ranking.audited.any()
    skipped = skipped_tags(ranking, ["nearly_all", "useless"])
    line = skipped_line(skipped)
    assert "useless (AUC 0.50)" in line
    assert "nearly_all (2 posts without it)" in line and "AUC 1.00" not in line
    assert {item["tag"]: item["without"] for item in skipped} == {"nearly_all": 2, "useless": 20}
