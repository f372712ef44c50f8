"""deepdanbooru audit PROJECT: rank the (post, tag) labels most likely wrong, for a person to act on.

Scores come from models that did not train on the post: K fold models (folds.py), each trained by
train-project's own entry, or a model from elsewhere (--model-path). Ranking: ranking.py. Output:
PROJECT/audit.csv, PROJECT/audit.html (page.py) and the record applying checks (results.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from deepdanbooru.audit import folds as fold_room
from deepdanbooru.audit.results import AUDIT_DIR, Suggestion, write_results
from deepdanbooru.dataset.records import Records, project_records
from deepdanbooru.errors import DatasetError, UserError, file_field
from deepdanbooru.project.config import load_config
from deepdanbooru.project.paths import ProjectPaths
from deepdanbooru.project.tags import load_tags
from deepdanbooru.wording import plural


def given_matrix(records: Records, tags) -> np.ndarray:
    """(posts, tags) 0/1: the post's tag_string carries the tag (tags outside tags.txt ignored, as training does)."""
    column = {tag: index for index, tag in enumerate(tags)}
    given = np.zeros((len(records), len(tags)), dtype=np.int8)
    for row, tag_string in enumerate(records.tag_strings):
        for tag in tag_string.split():
            index = column.get(tag)
            if index is not None:
                given[row, index] = 1
    return given


def run_audit(project_path, *, folds: int | None = None, model_path=None, time_limit: float | None = None,
              time_limit_text: str | None = None, top: int | None = None, batch_size: int = 32, echo=print):
    """Score, rank and write the audit; returns the suggestions, most likely a mistake first."""
    if (folds is None) == (model_path is None):
        raise UserError(f"audit: give --folds K (models trained on the other folds) or --model-path FILE "
                        f"(a model that never saw these posts){', not both' if folds is not None else ''}")
    if model_path is not None and time_limit is not None:
        raise UserError("audit: --time-limit bounds the training of each fold; --model-path trains nothing")
    from deepdanbooru.audit.ranking import require_cleanlab

    require_cleanlab()  # before hours of fold training, not after
    paths = ProjectPaths(project_path)
    config = load_config(paths.root)
    tags = load_tags(paths.tags)
    records = project_records(config, "audit")
    if folds is not None:
        config.require_epoch_count(time_limit)
        fold_of = fold_room.assign_folds(records, folds, config.seed)  # checks K before anything is written
        source = f"{folds}-fold models trained with the project's recipe"
        kept, scores, columns = _fold_scores(paths, config, records, fold_of, folds, time_limit, time_limit_text,
                                             batch_size, echo)
    else:
        from deepdanbooru.audit.scores import match_model

        outside = match_model(model_path, tags)
        others = "; the others are not audited" if len(outside.columns) < len(tags) else ""
        echo(f"Audit: {outside.path} knows {len(outside.columns):,} of the {len(tags):,} tags of tags.txt{others}")
        if Path(outside.path).resolve().parent == paths.root.resolve():
            echo(f"warning: {outside.path} is a model of this project: it trained on these posts and learned their "
                 "mistakes with them, so it will miss many; --folds K scores each post with a model that did not")
        source = f"model {outside.path}"
        kept, scores, columns = _outside_scores(outside, config, records, batch_size, echo)
    return finish(paths, records, tags, kept, scores, columns, source, top, echo)


def _fold_scores(paths, config, records, fold_of, folds, time_limit, time_limit_text, batch_size, echo):
    from deepdanbooru.audit.scores import score_records
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.project.resume import fine_tuned_network
    from deepdanbooru.training.train import train_project

    audit_dir = paths.root / AUDIT_DIR
    fold_list = fold_room.prepare_folds(audit_dir, records, folds, config.seed)
    raw = json.loads(paths.config.read_text(encoding="utf-8"))
    fine_tuned = fine_tuned_network(paths.checkpoints)
    source_model = fine_tuned["source"] if fine_tuned else None
    if source_model:
        echo(f"Audit: the project was fine-tuned from {source_model}; each fold starts from it too")
        echo(f"warning: a post {source_model} was trained on is not unseen by any fold, which starts from it: if it "
             "was trained on this database, its labels there score as it learnt them; audit with --model-path of a "
             "model that never saw these posts instead")
    clock = fold_room.FoldClock(time_limit)
    pending = [fold for fold in fold_list if fold_room.read_fold_scores(fold) is None]
    if len(pending) < folds:
        echo(f"Audit: {folds - len(pending)} of {folds} folds already scored; resuming with the others")
    kept_all, scores_all = [], []
    for fold in fold_list:
        held = np.flatnonzero(fold_of == fold.index)
        if fold in pending:
            left = len(pending) - pending.index(fold)
            echo(f"Audit: {fold.name}: training on {len(records) - len(held):,} posts, then scoring the "
                 f"{len(held):,} it does not see ({fold.directory}); time left for the audit: "
                 f"{clock.remaining(left)}")
            fold_room.make_fold_project(fold, paths.root, raw, config, np.asarray(records.ids)[fold_of != fold.index])
            clock.start()
            train_project(fold.directory, source_model=source_model, echo=echo, time_limit=time_limit,
                          time_limit_text=time_limit_text)
            files = resolve_model_files(project_path=fold.directory)
            model = load_model_file(files.model)
            subset = records.subset(held.tolist())
            kept, scores = score_records(model, files.model, config, subset, range(model.output_shape[-1]),
                                         batch_size, echo, what=f"{fold.name}, unseen")
            fold_room.write_fold_scores(fold, np.asarray(subset.ids)[kept], scores)
            took = clock.done()
            echo(f"Audit: {fold.name} done in {fold_room.format_seconds(took)}; time left for the audit: "
                 f"{clock.remaining(left - 1)}")
        ids, scores = fold_room.read_fold_scores(fold)
        kept_all.append(ids)
        scores_all.append(scores)
    index_of = {post_id: index for index, post_id in enumerate(records.ids)}
    ids = np.concatenate(kept_all)
    return (np.asarray([index_of[int(post_id)] for post_id in ids], dtype=np.int64), np.concatenate(scores_all),
            list(range(scores_all[0].shape[1])))


def _outside_scores(outside, config, records, batch_size, echo):
    from deepdanbooru.audit.scores import load_outside_model, score_records
    from deepdanbooru.inference.predict import configure_devices

    configure_devices(allow_gpu=True)
    model = load_outside_model(outside)
    kept, scores = score_records(model, outside.path, config, records, outside.outputs, batch_size, echo,
                                 what="every eligible post")
    return kept, scores, outside.columns


def finish(paths, records, tags, kept, scores, columns, source, top, echo) -> list[Suggestion]:
    """Rank the scored labels and write audit.csv, its record and the page."""
    from deepdanbooru.audit.page import write_page
    from deepdanbooru.audit.ranking import rank_labels

    if not len(kept):
        raise DatasetError(file_field(records.database_path, "posts", "no picture could be scored"))
    order = np.argsort(kept, kind="stable")
    kept, scores = kept[order], np.asarray(scores)[order]
    audited = [tags[column] for column in columns]
    given = given_matrix(records, tags)[kept][:, columns]
    # The scores behind the ranking, for a closer look (bench/audit.py measures rankings on them).
    (paths.root / AUDIT_DIR).mkdir(parents=True, exist_ok=True)
    np.savez(paths.root / AUDIT_DIR / "scores.npz", ids=np.asarray(records.ids)[kept], given=given, scores=scores,
             tags=np.asarray(audited))
    ranking = rank_labels(given, scores)
    suggestions = []
    for rank, (row, column) in enumerate(ranking.order(top), start=1):
        index = int(kept[row])
        suggestions.append(Suggestion(int(records.ids[index]), records.md5s[index], audited[column],
                                      int(given[row, column]), float(scores[row, column]), rank))
    posts = {int(records.ids[index]): {"md5": records.md5s[index], "tags": records.tag_strings[index]}
             for index in kept.tolist()}
    csv_path, _ = write_results(paths.root, suggestions, posts, records.database_path, source, audited)
    page = write_page(paths.root, suggestions, records)
    missing = sum(s.given == 0 for s in suggestions)
    echo(f"Audit: {plural(len(suggestions), 'suggestion')} ({missing:,} missing, {len(suggestions) - missing:,} wrong) "
         f"over {plural(len(kept), 'post')} and {plural(len(audited), 'tag')}: {csv_path}")
    echo(f"Review them in {page} (accept or reject, then export), or delete the rows you reject from a copy of "
         f"{csv_path.name}; then: deepdanbooru audit {paths.root} --apply FILE")
    return suggestions
