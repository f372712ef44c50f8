"""How well `deepdanbooru audit` finds injected tag mistakes, and what fixing them gains.

    python bench/audit.py [--count 2000] [--test 500] [--outside 1500] [--size 64] [--fold-time 3m]
                          [--train-time 3m] [--retrain-epochs 10] [--work DIR] [--out audit-results]

Data: the basic sample (make-sample-dataset), whose tags are facts about the pictures, so the true
tags are known. Posts 1..count are the audited project; of their true (post, tag) pairs 10% are
removed and wrong ones, 2% as many as the true pairs, are added (seeded). Posts count+1..count+test
keep their true tags and measure the models (never audited or trained on). A third dataset (seed 1,
`--outside` posts, true tags) trains the model from elsewhere for the --model-path audit. Run again
with the same --work, the audits resume (their scores are kept) and the retraining runs anew.

Measured:
- K-fold (3 folds, each `--fold-time` of training) and --model-path audits: precision and recall of
  the top N labels (N = the number injected) against the injected errors, for cleanlab's ranking
  (what the audit writes) and for the plain margin |given - score| on the same scores; also how many
  rows audit.csv holds (as many as cleanlab's filter flags) and their precision and recall.
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
    connection = sqlite3.connect(database)
    for post_id, tag_string in rows:
        kept = [tag for tag in tag_string.split() if (post_id, tag) not in removed]
        kept += [tag for tag in tags if (post_id, tag) in added]
        general = [tag for tag in kept if not tag.startswith("rating:")]
        connection.execute("UPDATE posts SET tag_string = ?, tag_count_general = ? WHERE id = ?",
                           (" ".join(kept), len(general), post_id))
    connection.commit()
    connection.close()
    return removed | added


def make_project(folder: Path, database: Path, tags_file: Path, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(RECIPE, database_path=str(database), **overrides)
    (folder / "project.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copy(tags_file, folder / "tags.txt")
    return folder


def ranking_figures(project: Path, injected: set) -> dict:
    """Top-N precision/recall of cleanlab's ranking and of the plain margin, from the audit's saved scores."""
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
    ranking = rank_labels(given, scores)
    margin = np.abs(given - scores)  # the plain margin: how far the score is from the given label
    margin_order = np.argsort(-margin, axis=None, kind="stable")[:n]
    cleanlab_top = ranking.full_order()[:n]
    flagged = ranking.flagged
    rows = ranking.order()  # audit.csv's rows
    hits = {
        "cleanlab": int(truth[cleanlab_top[:, 0], cleanlab_top[:, 1]].sum()),
        "margin": int(truth.flat[margin_order].sum()),
    }
    return {
        "injected": n, "labels": int(given.size),
        **{f"{name}_top_n_precision": hit / n for name, hit in hits.items()},
        **{f"{name}_top_n_recall": hit / n for name, hit in hits.items()},
        "rows": len(rows),  # audit.csv: as many as the filter flags, lowest quality first
        "rows_precision": float(truth[rows[:, 0], rows[:, 1]].mean()) if len(rows) else None,
        "rows_recall": float(truth[rows[:, 0], rows[:, 1]].sum() / n),
        "filter_set_precision": float(truth[flagged].mean()) if flagged.any() else None,
    }


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
    args = parser.parse_args()
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
    results["kfold"] = dict(ranking_figures(kfold, injected), seconds=round(time.monotonic() - t0))
    print("k-fold:", results["kfold"], flush=True)

    outside_project = make_project(work / "p-outside", outside_data / "dataset.sqlite", tags_file)
    cli("train-project", outside_project, "--time-limit", args.train_time, log=log)
    by_model = make_project(work / "p-model", noisy / "dataset.sqlite", tags_file)
    cli("audit", by_model, "--model-path", export_of(outside_project), log=log)
    results["model_path"] = ranking_figures(by_model, injected)
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
