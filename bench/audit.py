"""How well `deepdanbooru audit` finds injected tag mistakes, and what fixing them gains.

    python bench/audit.py [--count 2000] [--test 500] [--outside 1500] [--size 64] [--fold-time 3m]
                          [--train-time 3m] [--retrain-epochs 10] [--work DIR] [--out audit-results]
    python bench/audit.py --emoji DATASET_DIR [--count 1500] [--fold-time 4m] [--model-path MODEL]
                          [--skip folds|model] [--seed 0] [--work DIR] [--out audit-results]

--emoji measures drawn pictures instead (emoji_case): --count posts of a dataset folder (the transfer
bench's finetune/), one of the 30 most carried tags removed from 12% of the posts and one added to 6%
(the mistakes a tagger's user meets), audited with --model-path MODEL and with 3 folds of --fold-time.

Data: the basic sample (make-sample-dataset), whose tags are facts about the pictures, so the true
tags are known. Posts 1..count are the audited project; of their true (post, tag) pairs 10% are
removed and wrong ones, 2% as many as the true pairs, are added (seeded). Posts count+1..count+test
keep their true tags and measure the models (never audited or trained on). A third dataset (seed 1,
`--outside` posts, true tags) trains the model from elsewhere for the --model-path audit. Run again
with the same --work, the audits resume (their scores are kept) and the retraining runs anew.

Measured:
- K-fold (3 folds, each `--fold-time` of training) and --model-path audits (audit_figures): precision of
  the first 50, 100 and N rows of the audit's ranking (N = the injected mistakes on tags the scores
  cover), the default list's rows, precision and recall, and the same for the calibration on the scores
  alone (no tag votes), cleanlab's label quality (when installed) and the plain margin |given - score|.
- Retraining: the project trained `--retrain-epochs` epochs on the noisy tags and on the tags fixed
  by applying (audit --apply) the top-N K-fold suggestions a reviewer who knows the truth accepts;
  mAP and macro-F1 on the clean test posts (evaluate-project --metrics).

Every model trains with the same recipe: resnet_small, Adam at 0.002 with the sample project's two
steps as fractions of the run; the fold and outside models for a wall-clock budget (epoch_count
"fit" under --time-limit: on a busier machine, fewer epochs), the two retraining runs for a fixed
number of epochs, so that only their tags differ.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RECIPE = {
    "image_width": 64, "image_height": 64, "minimum_tag_count": 0, "model": "resnet_small", "minibatch_size": 32,
    "epoch_count": "fit", "export_model_per_epoch": 0, "checkpoint_frequency_mb": 25,
    "console_logging_frequency_mb": 25, "optimizer": "adam", "learning_rate": 0.002,
    "learning_rates": [{"used_fraction": 0.67, "learning_rate": 0.0005}, {"used_fraction": 0.92, "learning_rate": 0.0002}],
    "seed": 0, "validation_fraction": 0.0,
}
REMOVED, ADDED = 0.10, 0.02


def cli(*args, log=None) -> str:
    argv = [sys.executable, "-m", "deepdanbooru", *map(str, args)]
    print("$", " ".join(argv[2:]), flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if log is not None:
        with open(log, "a", encoding="utf-8") as stream:
            stream.write(f"$ {' '.join(argv[2:])}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def posts(database):
    connection = sqlite3.connect(database)
    try:
        return connection.execute("SELECT id, tag_string FROM posts ORDER BY id").fetchall()
    finally:
        connection.close()


def subset_database(source: Path, target: Path, low: int, high: int) -> None:
    """A dataset folder of the posts low..high of `source`'s (images linked, rows copied)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target / "dataset.sqlite")
    connection = sqlite3.connect(target / "dataset.sqlite")
    connection.execute("DELETE FROM posts WHERE id < ? OR id > ?", (low, high))
    connection.commit()
    connection.close()
    images = target / "images"
    if not images.exists():
        os.symlink(source.parent / "images", images)


def inject(database: Path, tags: list[str], seed: int = 0) -> set:
    """Remove REMOVED of the true pairs, add ADDED as many wrong ones; returns the injected (id, tag) pairs."""
    rng = np.random.default_rng(seed)
    rows = posts(database)
    truth = [(post_id, tag) for post_id, tag_string in rows for tag in tag_string.split() if tag in tags]
    absent = [(post_id, tag) for post_id, tag_string in rows for tag in tags if tag not in tag_string.split()]
    removed = {truth[i] for i in rng.choice(len(truth), int(round(REMOVED * len(truth))), replace=False)}
    added = {absent[i] for i in rng.choice(len(absent), int(round(ADDED * len(truth))), replace=False)}
    write_tags(database, {post_id: [tag for tag in tag_string.split() if (post_id, tag) not in removed]
                          + [tag for tag in tags if (post_id, tag) in added] for post_id, tag_string in rows})
    return removed | added


def write_tags(database: Path, tags_of: dict) -> None:
    """Each post of tags_of {post id: its tags} stored with those tags and their general count."""
    connection = sqlite3.connect(database)
    for post_id, tags in tags_of.items():
        general = [tag for tag in tags if not tag.startswith("rating:")]
        connection.execute("UPDATE posts SET tag_string = ?, tag_count_general = ? WHERE id = ?",
                           (" ".join(tags), len(general), post_id))
    connection.commit()
    connection.close()


def make_project(folder: Path, database: Path, tags_file: Path, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(RECIPE, database_path=str(database), **overrides)
    (folder / "project.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(tags_file, folder / "tags.txt")
    return folder


def test_metrics(model: Path, test_project: Path) -> dict:
    out = cli("evaluate-project", test_project, "--metrics", "--split", "all", "--model-path", model,
              "--threshold", "0.5", "--format", "json")
    metrics = json.loads(out.strip().splitlines()[-1])["metrics"]
    return {"map": metrics["map"], "macro_f1": metrics["macro_f1"]}


def export_of(project: Path) -> Path:
    for name in ("model-resnet_small.keras", "model-resnet_small.stopped.keras"):
        if (project / name).is_file():
            return project / name
    sys.exit(f"no export in {project}")


EMOJI_RECIPE = {  # the source tagger's own recipe (bench/transfer_recipes.json scratch_fit over quality.py's base)
    "minimum_tag_count": 1, "image_extensions": ["png"], "seed": 0, "validation_fraction": 0.1,
    "validation_frequency_slices": 1, "validation_threshold": 0.5, "checkpoint_frequency_mb": 100,
    "console_logging_frequency_mb": 10, "epoch_count": "fit", "mixed_precision": False, "image_width": 64,
    "image_height": 64, "model": "resnet_small", "optimizer": "adamw", "weight_decay": 0.05, "learning_rate": 0.002,
    "learning_rates": [{"used_fraction": 0.675, "learning_rate": 0.0005},
                       {"used_fraction": 0.925, "learning_rate": 0.0002}],
    "loss": "asymmetric", "export_model_per_epoch": 1000,
}
COMMON_TAGS, REMOVED_POSTS, ADDED_POSTS = 30, 0.12, 0.06


def emoji_subset(source: Path, target: Path, count: int, seed: int = 0) -> None:
    """`count` posts of `source` drawn at random (seeded); pictures linked, tags.txt copied."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "dataset.sqlite", target / "dataset.sqlite")
    shutil.copy(source / "tags.txt", target / "tags.txt")
    if not (target / "images").exists():
        os.symlink((source / "images").resolve(), target / "images")
    ids = [post_id for post_id, _ in posts(target / "dataset.sqlite")]
    keep = set(np.random.default_rng(seed).choice(ids, min(count, len(ids)), replace=False).tolist())
    connection = sqlite3.connect(target / "dataset.sqlite")
    connection.executemany("DELETE FROM posts WHERE id = ?", [(i,) for i in ids if i not in keep])
    connection.commit()
    connection.execute("VACUUM")
    connection.close()


def inject_common(database: Path, seed: int = 0) -> set:
    """The injected mistakes: one common tag (the COMMON_TAGS most carried) removed from REMOVED_POSTS of the
    posts (drawn among those carrying one) and one common tag a post lacks added to ADDED_POSTS of them
    (other posts). Returns the injected (id, tag) pairs."""
    rng = np.random.default_rng(seed)
    rows = posts(database)
    counts = {}
    for _, tag_string in rows:
        for tag in tag_string.split():
            counts[tag] = counts.get(tag, 0) + 1
    common = sorted(counts, key=lambda tag: (-counts[tag], tag))[:COMMON_TAGS]
    order = rng.permutation(len(rows))
    removed, added, changed = set(), set(), {}
    carriers = [i for i in order if set(rows[i][1].split()) & set(common)]
    for i in carriers[:int(round(REMOVED_POSTS * len(rows)))]:
        post_id, tag_string = rows[i]
        tag = str(rng.choice(sorted(set(tag_string.split()) & set(common))))
        removed.add((post_id, tag))
        changed[post_id] = [t for t in tag_string.split() if t != tag]
    others = [i for i in order if rows[i][0] not in changed]
    for i in others[:int(round(ADDED_POSTS * len(rows)))]:
        post_id, tag_string = rows[i]
        tag = str(rng.choice(sorted(set(common) - set(tag_string.split()))))
        added.add((post_id, tag))
        changed[post_id] = tag_string.split() + [tag]
    write_tags(database, changed)
    return removed | added


def emoji_case(args) -> None:
    """The case on drawn pictures: --count posts of --emoji with the common-tag mistakes injected,
    audited with --model-path and with 3 folds of --fold-time each; figures from each audit's outputs."""
    work = args.work or Path(tempfile.mkdtemp(prefix="audit-emoji-"))
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "audit-emoji.log"
    data = work / "data"
    if not (data / "injected.json").is_file():
        emoji_subset(args.emoji, data, args.count, args.seed)
        injected = inject_common(data / "dataset.sqlite", args.seed)
        (data / "injected.json").write_text(json.dumps(sorted(injected)) + "\n")
    injected = {tuple(pair) for pair in json.loads((data / "injected.json").read_text())}
    results = {"data": str(args.emoji), "count": args.count, "seed": args.seed, "injected": len(injected)}
    recipe = dict(EMOJI_RECIPE)
    runs = []
    if "model" not in args.skip and args.model_path is not None:
        runs.append(("model_path", ["--model-path", args.model_path]))
    if "folds" not in args.skip:
        runs.append(("folds", ["--folds", 3, "--time-limit", args.fold_time]))
    for name, options in runs:
        folder = work / f"p-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "project.json").write_text(json.dumps(dict(recipe, database_path=str(data / "dataset.sqlite")),
                                                        indent=2) + "\n")
        shutil.copy(data / "tags.txt", folder / "tags.txt")
        t0 = time.monotonic()
        cli("audit", folder, *options, log=log)
        results[name] = dict(audit_figures(folder, injected), seconds=round(time.monotonic() - t0))
        print(name, json.dumps(results[name], indent=1), flush=True)
    (args.out / "audit-emoji.json").write_text(json.dumps(results, indent=2) + "\n")


def audit_figures(project: Path, injected: set) -> dict:
    """What a person reviewing the audit meets: precision of its first 50, 100 and N rows in the ranked
    order (N = the injected mistakes on tags the scores cover), the default list's rows, precision and
    recall, and the same top-N figures for other rankings of the same scores."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from deepdanbooru.audit.ranking import rank_labels

    saved = np.load(project / "audit" / "scores.npz")
    ids, given, scores, tags = saved["ids"], saved["given"], saved["scores"], list(saved["tags"])
    truth = np.zeros(given.shape, dtype=bool)
    column = {tag: index for index, tag in enumerate(tags)}
    row = {int(post_id): index for index, post_id in enumerate(ids)}
    for post_id, tag in injected:
        if post_id in row and tag in column:
            truth[row[post_id], column[tag]] = True
    n = int(truth.sum())
    votes = saved["votes"] if "votes" in saved.files else None
    ranking = rank_labels(given, scores, votes)
    full = ranking.full_order()
    hits = truth[full[:, 0], full[:, 1]]
    default = ranking.order()
    found = truth[default[:, 0], default[:, 1]] if len(default) else np.zeros(0, dtype=bool)
    margin = np.argsort(-np.abs(given - scores), axis=None, kind="stable")[:n]
    try:  # the ranking audit used before its own calibration: cleanlab's label quality, for comparison
        from cleanlab.multilabel_classification import rank as cl_rank

        quality = np.asarray(cl_rank.get_label_quality_scores_per_class(
            [np.flatnonzero(r).tolist() for r in given], np.clip(scores, 0, 1), method="self_confidence",
            adjust_pred_probs=True))
        cleanlab_order = np.argsort(quality, axis=None, kind="stable")
        cleanlab = {f"cleanlab_precision_at_{k}": float(truth.flat[cleanlab_order[:k]].mean())
                    for k in (50, 100, n)}
    except ImportError:
        cleanlab = {}
    figures = {"injected_known": n, "labels": int(given.size),
               **{f"precision_at_{k}": float(hits[:k].mean()) if len(hits) else None for k in (50, 100)},
               "precision_at_n": float(hits[:n].mean()), "rows": int(len(default)),
               "rows_precision": float(found.mean()) if len(found) else None,
               "rows_recall": float(found.sum() / n) if n else None,
               "ranked_anywhere": int(hits.sum()), "margin_precision_at_n": float(truth.flat[margin].mean()),
               **cleanlab}
    if votes is not None:  # the ranking on the model's scores alone, without the post's other tags
        alone = rank_labels(given, scores)
        order = alone.full_order()
        alone_hits = truth[order[:, 0], order[:, 1]]
        rows = alone.order()
        figures["scores_only"] = {
            **{f"precision_at_{k}": float(alone_hits[:k].mean()) for k in (50, 100)},
            "precision_at_n": float(alone_hits[:n].mean()), "rows": int(len(rows)),
            "rows_precision": float(truth[rows[:, 0], rows[:, 1]].mean()) if len(rows) else None,
            "rows_recall": float(truth[rows[:, 0], rows[:, 1]].sum() / n) if n else None,
            "estimated_errors": round(alone.estimated_errors, 1)}
    figures["estimated_errors"] = round(ranking.estimated_errors, 1)
    summary = project / "audit" / "audit.json"
    if summary.is_file():
        record = json.loads(summary.read_text())
        figures["summary"] = {key: record[key] for key in ("estimated_errors", "validation", "skipped_tags")
                              if key in record}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--test", type=int, default=500)
    parser.add_argument("--outside", type=int, default=1500)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--fold-time", default="3m")
    parser.add_argument("--train-time", default="3m")
    parser.add_argument("--retrain-epochs", type=int, default=10)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--out", type=Path, default=Path("audit-results"))
    parser.add_argument("--emoji", type=Path, help="a dataset folder of drawn pictures (the transfer bench's "
                        "finetune/): measure on it instead of the generated shapes (see emoji_case)")
    parser.add_argument("--model-path", type=Path, help="with --emoji: the tagger for the --model-path audit")
    parser.add_argument("--skip", default="", help="with --emoji: 'folds' or 'model' to leave that audit out")
    parser.add_argument("--seed", type=int, default=0, help="with --emoji: the draw of the posts and the mistakes")
    args = parser.parse_args()
    if args.emoji is not None:
        return emoji_case(args)
    work = args.work or Path(tempfile.mkdtemp(prefix="audit-bench-"))
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "audit-bench.log"
    RECIPE["image_width"] = RECIPE["image_height"] = args.size
    started = time.monotonic()

    full, outside_data = work / "full", work / "outside"
    cli("make-sample-dataset", full, "--count", args.count + args.test, "--size", args.size, "--seed", 0, log=log)
    cli("make-sample-dataset", outside_data, "--count", args.outside, "--size", args.size, "--seed", 1, log=log)
    tags_file = full / "tags.txt"
    tags = [line.strip() for line in tags_file.read_text().splitlines() if line.strip()]
    noisy, test, fixed = work / "noisy", work / "test", work / "fixed"
    subset_database(full / "dataset.sqlite", noisy, 1, args.count)
    subset_database(full / "dataset.sqlite", test, args.count + 1, args.count + args.test)
    injected = inject(noisy / "dataset.sqlite", tags)
    results = {"count": args.count, "test": args.test, "outside": args.outside, "size": args.size,
               "fold_time": args.fold_time, "train_time": args.train_time, "injected": len(injected)}
    test_project = make_project(work / "p-test", test / "dataset.sqlite", tags_file)

    kfold = make_project(work / "p-kfold", noisy / "dataset.sqlite", tags_file)
    t0 = time.monotonic()
    cli("audit", kfold, "--folds", 3, "--time-limit", args.fold_time, log=log)
    results["kfold"] = dict(audit_figures(kfold, injected), seconds=round(time.monotonic() - t0))
    print("k-fold:", results["kfold"], flush=True)

    outside_project = make_project(work / "p-outside", outside_data / "dataset.sqlite", tags_file)
    cli("train-project", outside_project, "--time-limit", args.train_time, log=log)
    by_model = make_project(work / "p-model", noisy / "dataset.sqlite", tags_file)
    cli("audit", by_model, "--model-path", export_of(outside_project), log=log)
    results["model_path"] = audit_figures(by_model, injected)
    print("model-path:", results["model_path"], flush=True)

    # The fixed data: the noisy database with the top-N K-fold suggestions a reviewer who knows the truth
    # accepts, applied by the audit itself.
    n = len(injected)
    with open(kfold / "audit.csv", newline="") as stream:
        rows = list(csv.reader(stream))
    header, body = rows[0], rows[1:]
    accepted = [row for row in body[:n] if (int(row[0]), row[2]) in injected]
    shutil.rmtree(fixed, ignore_errors=True)
    shutil.copytree(noisy, fixed, symlinks=True)
    accept_file = args.out / "accepted.csv"
    with open(accept_file, "w", newline="") as stream:
        csv.writer(stream, lineterminator="\n").writerows([header, *accepted])
    cli("audit", kfold, "--apply", accept_file, log=log)  # changes noisy/dataset.sqlite; the backup keeps it
    backup = sorted((kfold / "audit" / "backups").iterdir())[-1] / "dataset.sqlite"
    shutil.copy(noisy / "dataset.sqlite", fixed / "dataset.sqlite")
    shutil.copy(backup, noisy / "dataset.sqlite")  # the noisy database back, for the baseline
    results["applied"] = {"rows": len(accepted), "of_top_n": min(n, len(body))}

    # Same epochs, same seed, same steps: the tags are the only difference (a wall-clock budget on a
    # shared machine would give one run more epochs than the other).
    trained = {}
    for name, data in (("noisy", noisy), ("fixed", fixed)):
        folder = work / f"p-train-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        project = make_project(folder, data / "dataset.sqlite", tags_file, epoch_count=args.retrain_epochs)
        cli("train-project", project, log=log)
        trained[name] = test_metrics(export_of(project), test_project)
    trained["outside_clean"] = test_metrics(export_of(outside_project), test_project)
    results["retraining"] = trained
    results["seconds"] = round(time.monotonic() - started)
    (args.out / "audit-bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
