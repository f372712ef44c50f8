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
from deepdanbooru.errors import DatasetError, ModelError, UserError, file_field
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
              time_limit_text: str | None = None, top: int | None = None, min_probability: float | None = None,
              batch_size: int = 32, echo=print):
    """Score, rank and write the audit; returns the suggestions, most likely a mistake first."""
    if (folds is None) == (model_path is None):
        raise UserError(f"audit: give --folds K (models trained on the other folds) or --model-path FILE "
                        f"(a model that never saw these posts){', not both' if folds is not None else ''}")
    if model_path is not None and time_limit is not None:
        raise UserError("audit: --time-limit bounds the training of each fold; --model-path trains nothing")
    if min_probability is not None and not 0.0 <= min_probability <= 1.0:
        raise UserError(f"--min-probability {min_probability}: must be a number from 0 to 1")
    paths = ProjectPaths(project_path)
    config = load_config(paths.root)
    tags = load_tags(paths.tags)
    records = project_records(config, "audit")
    if folds is not None:
        config.require_epoch_count(time_limit)
        fold_of = fold_room.assign_folds(records, folds, config.seed)  # checks K before anything is written
        source = f"{folds}-fold models trained with the project's recipe"
        kept, scores, columns, groups = _fold_scores(paths, config, records, tags, fold_of, folds, time_limit,
                                                     time_limit_text, batch_size, echo)
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
        groups = [{"model": str(outside.path), "posts": kept}]
    return finish(paths, records, tags, kept, scores, columns, source, top, echo, groups=groups,
                  min_probability=min_probability, seed=config.seed)


def _fold_scores(paths, config, records, tags, fold_of, folds, time_limit, time_limit_text, batch_size, echo):
    from deepdanbooru.audit.scores import score_records
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.project.resume import fine_tuned_network
    from deepdanbooru.training.train import train_project

    audit_dir = paths.root / AUDIT_DIR
    fold_list = fold_room.prepare_folds(audit_dir, records, folds, config.seed, tags, fold_of, paths.tags)
    raw = json.loads(paths.config.read_text(encoding="utf-8"))
    fine_tuned = fine_tuned_network(paths.checkpoints)
    source_model = fine_tuned["source"] if fine_tuned else None
    if source_model:
        echo(f"Audit: the project was fine-tuned from {source_model}; each fold starts from it too")
        echo(f"warning: every fold starts from {source_model}, so a post that model was trained on is seen by "
             "every fold, not unseen: if it was trained on this database, those posts' labels score as it learnt "
             "them; audit with --model-path of a model that never saw these posts instead")
    clock = fold_room.FoldClock(time_limit)
    pending = [fold for fold in fold_list if fold_room.read_fold_scores(fold) is None]
    if len(pending) < folds:
        echo(f"Audit: {folds - len(pending)} of {folds} folds already scored; resuming with the others")
    kept_all, scores_all, groups = [], [], []
    ids = np.asarray(records.ids, dtype=np.int64)
    for fold in fold_list:
        held = np.flatnonzero(fold_of == fold.index)
        if fold in pending:
            left = len(pending) - pending.index(fold)
            echo(f"Audit: {fold.name}: training on {len(records) - len(held):,} posts, then scoring the "
                 f"{len(held):,} it does not see ({fold.directory}); time left for the audit: "
                 f"{clock.remaining(left)}")
            fold_room.make_fold_project(fold, paths.root, raw, config, ids[fold_of != fold.index])
            clock.start()
            watch = fold_room.TrainingWatch(echo)
            counters = train_project(fold.directory, source_model=source_model, echo=watch, time_limit=time_limit,
                                     time_limit_text=time_limit_text)
            files = resolve_model_files(project_path=fold.directory)
            model = load_model_file(files.model)
            if model.output_shape[-1] != len(tags):
                raise ModelError(file_field(files.model, "output", (
                    f"has {model.output_shape[-1]:,} scores for the {len(tags):,} tags of tags.txt")))
            subset = records.subset(held.tolist())
            kept, scores = score_records(model, files.model, config, subset, range(model.output_shape[-1]),
                                         batch_size, echo, what=f"{fold.name}, unseen")
            took = clock.done()
            trained = watch.trained(counters, len(records) - len(held), took)
            fold_room.write_fold_scores(fold, np.asarray(subset.ids)[kept], scores, trained)
            echo(f"Audit: {fold_room.describe_training(fold.name, trained)}; done in "
                 f"{fold_room.format_seconds(took)}; time left for the audit: {clock.remaining(left - 1)}")
        saved = fold_room.read_fold_scores(fold)
        if saved.scores.shape[1] != len(tags) or not set(saved.ids.tolist()) <= set(ids[held].tolist()):
            raise ModelError(file_field(fold.scores, None, (
                f"holds scores for {saved.scores.shape[1]:,} tags of posts not all in {fold.name} as recorded in "
                f"{audit_dir / fold_room.STATE_FILE}; delete it and run the audit again to score the fold anew")))
        kept_all.append(saved.ids)
        scores_all.append(saved.scores)
        groups.append({"model": fold.name, "ids": saved.ids, "trained": saved.trained})
    index_of = {post_id: index for index, post_id in enumerate(records.ids)}
    for group in groups:
        group["posts"] = np.asarray([index_of[int(post_id)] for post_id in group.pop("ids")], dtype=np.int64)
    return (np.concatenate([group["posts"] for group in groups]), np.concatenate(scores_all),
            list(range(len(tags))), groups)


def _outside_scores(outside, config, records, batch_size, echo):
    from deepdanbooru.audit.scores import load_outside_model, score_records
    from deepdanbooru.inference.predict import configure_devices

    configure_devices(allow_gpu=True)
    model = load_outside_model(outside)
    kept, scores = score_records(model, outside.path, config, records, outside.outputs, batch_size, echo,
                                 what="every eligible post")
    return kept, scores, outside.columns


def finish(paths, records, tags, kept, scores, columns, source, top, echo, groups=None,
           min_probability: float | None = None, seed: int = 0) -> list[Suggestion]:
    """Rank the scored labels and write audit.csv, its record and the page. groups: the scoring models,
    each {"model": name, "posts": indices into records, "trained": how far it trained (folds)}."""
    from deepdanbooru.audit import summary as summary_room
    from deepdanbooru.audit.cooccurrence import tag_votes
    from deepdanbooru.audit.page import write_page
    from deepdanbooru.audit.ranking import rank_labels

    if not len(kept):
        raise DatasetError(file_field(records.database_path, "posts", "no picture could be scored"))
    scores = np.asarray(scores)
    if scores.shape != (len(kept), len(columns)):
        raise DatasetError(file_field(paths.tags, None, (
            f"names {len(columns):,} audited tags, but the scores have {scores.shape[-1]:,} a post")))
    order = np.argsort(kept, kind="stable")
    kept, scores = kept[order], scores[order]
    audited = [tags[column] for column in columns]
    every_tag = given_matrix(records, tags)[kept]
    given = every_tag[:, columns]
    votes = tag_votes(every_tag, columns, np.asarray(records.ids)[kept], seed=seed)
    # The scores behind the ranking, for a closer look (bench/audit.py measures rankings on them).
    (paths.root / AUDIT_DIR).mkdir(parents=True, exist_ok=True)
    fold_room.save_arrays(paths.root / AUDIT_DIR / "scores.npz", ids=np.asarray(records.ids)[kept], given=given,
                          scores=scores, votes=votes, tags=np.asarray(audited))
    ranking = rank_labels(given, scores, votes)
    suggestions = []
    for rank, (row, column) in enumerate(ranking.order(top, min_probability), start=1):
        index = int(kept[row])
        suggestions.append(Suggestion(int(records.ids[index]), records.md5s[index], audited[column],
                                      int(given[row, column]), float(scores[row, column]), rank,
                                      float(ranking.probability[row, column])))
    row_of = {int(index): row for row, index in enumerate(kept.tolist())}
    validation = []
    for group in groups or [{"model": source, "posts": kept}]:
        rows = np.asarray([row_of[int(index)] for index in group["posts"]], dtype=np.int64)
        figures = summary_room.validation_figures(group["model"], given[rows], scores[rows])
        if "trained" in group:
            figures["trained"] = group["trained"]
        validation.append(figures)
    skipped = summary_room.skipped_tags(ranking, audited)
    weak = summary_room.too_weak(validation)
    short = [figures for figures in validation if fold_room.short_training(figures.get("trained") or {})]
    summary = {"estimated_errors": round(ranking.estimated_errors, 1), "noise_rates": ranking.rates,
               "validation": validation, "skipped_tags": skipped, "warnings": []}
    posts = {int(records.ids[index]): {"md5": records.md5s[index], "tags": records.tag_strings[index]}
             for index in kept.tolist()}
    for figures in validation:
        trained = f"; {fold_room.describe_training('it', figures['trained'])}" if "trained" in figures else ""
        echo(f"Audit: {figures['model']}: mAP {figures['map']}, mean AUC {figures['mean_auc']} on the "
             f"{figures['posts']:,} posts it did not see (their labels as given){trained}")
    line = summary_room.skipped_line(skipped)
    if line:
        echo(line)
    if short:
        their = "their scores are from models" if len(short) > 1 else "its scores are from a model"
        advice = (f"{', '.join(figures['model'] for figures in short)} stopped by --time-limit before half the "
                  f"epochs planned: {their} far from trained. To train the folds further, "
                  f"delete {paths.root / AUDIT_DIR / 'folds'}/fold-*/{fold_room.SCORES_FILE} and run the audit "
                  f"again with a longer --time-limit (each fold resumes from its checkpoint), or set "
                  f"\"epoch_count\": \"fit\" so each fold plans the epochs its --time-limit allows")
        summary["warnings"].append(advice)
        echo(f"warning: {advice}")
    if weak:
        summary["warnings"].append(weak)
        echo(f"warning: {weak}")
    csv_path, _ = write_results(paths.root, suggestions, posts, records.database_path, source, audited, summary)
    page = write_page(paths.root, suggestions, records, summary)
    missing = sum(s.given == 0 for s in suggestions)
    floor = min((s.probability for s in suggestions), default=None)
    estimated = round(ranking.estimated_errors)
    echo(f"Audit: about {plural(estimated, 'label error')} estimated over {plural(len(kept), 'post')} "
         f"and {plural(int(ranking.audited.sum()), 'audited tag')}; {plural(len(suggestions), 'suggestion')} "
         f"({missing:,} missing, {len(suggestions) - missing:,} wrong"
         f"{f', probability {floor:.2f} and up' if floor is not None else ''}): {csv_path}")
    echo(f"Review them in {page} (accept or reject, then export), or delete the rows you reject from a copy of "
         f"{csv_path.name}; then: deepdanbooru audit {paths.root} --apply FILE")
    return suggestions
