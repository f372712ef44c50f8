"""Tagger quality at equal wall-clock time: each recipe trained for the same budget on the hard sample.

    python bench/quality.py [--budget 600] [--recipes deepdanbooru,resnet_small,modern]
                            [--recipes-file FILE.json] [--count 6000] [--size 64] [--seed 0]
                            [--work DIR] [--out quality-results] [--stop auto|time-limit|signal]
                            [--dataset DIR] [--held-back TAGS.txt]
    python bench/quality.py --merge OUT1/quality.json OUT2/quality.json ... [--held-back TAGS.txt] --out DIR

Every recipe trains on the same dataset (`make-sample-dataset --preset hard`,
generated once into --work and kept there between runs) with the same
validation split (validation_fraction and seed are the bench's, not the
recipe's), one after the other, each in its own `train-project` process
stopped at --budget seconds of wall-clock time (start-up, validation and
checkpoints included). The run is stopped by `train-project --time-limit`
when the installed tool has it (it checkpoints, exports and exits 0 before
the limit), otherwise by SIGINT at the budget (--stop signal: the work since
the last slice is lost, so slices are kept short).

Measured: the project validates after every slice, and logs/history.jsonl
holds each validation with its time. The curve is macro-F1 (and micro-F1,
mAP) against minutes since the process started; the result of a recipe is
its last validation within the budget, i.e. of the weights it would leave
behind. Printed side by side with the ratio to DeepDanbooru's recipe and to
the best ResNet recipe; written to OUT/quality.json, OUT/quality.md (the
table for docs/quality.md), OUT/<recipe>.png (its learning curve) and
OUT/curves.png and OUT/curves-map.png (all of them: macro-F1, mAP), drawn
by matplotlib (pip install -e ".[report]").

A recipe is a set of project.json overrides (RECIPES below). One the
installed deepdanbooru does not understand (an unknown key, a model or loss
it does not have) is refused before anything trains. A recipe may also name
a `source_model` (a .keras file, not a project.json key): its run is
`train-project --source-model FILE`, with `--source-tags` the
`<stem>.tags.txt` beside it (what `import-model` writes), so fine-tuning a
pretrained model competes with training from scratch on the same clock.

--dataset DIR trains on a Danbooru-style dataset of one's own instead of the
hard sample: DIR/dataset.sqlite with DIR/images/ and DIR/tags.txt (the
vocabulary); bench/transfer_data.py writes such folders. --held-back FILE
(one tag a line) then also measures each run's final export on the
validation split and prints mAP and macro-F1 (at P=R, at per-tag thresholds)
over all tags and over the tags of FILE alone (bench/held_back.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from curves import line_chart  # noqa: E402

from deepdanbooru.project.recipes import RECIPES as PROJECT_RECIPES  # noqa: E402

MODERN = PROJECT_RECIPES["modern"]

# What every recipe shares: the data, the split, the cadence of measurement. epoch_count is large so
# that the budget ends the run; a recipe whose schedule depends on it (learning_rates, warmup_cosine)
# sets its own, to the epochs it reaches in the budget (printed as "epochs").
BASE = {
    "minimum_tag_count": 1,
    "image_extensions": ["jpg"],
    "seed": 0,
    "validation_fraction": 0.1,
    "validation_frequency_slices": 1,
    "validation_threshold": 0.5,
    "checkpoint_frequency_mb": 100,
    "console_logging_frequency_mb": 10,
    "epoch_count": 1000,
    "mixed_precision": False,
}

# The recipes compared. Baselines are named by BASELINES below. checkpoint_frequency_mb (the slice, so
# the cadence of validation) is set per recipe to about a minute of training on 2 cores, so validation
# stays a small share of every budget (the table prints the share) and a stopped run loses little.
RECIPES: dict[str, dict] = {
    # DeepDanbooru's recipe: its model, Adam at its default rate, BCE, its augmentation, no schedule.
    "deepdanbooru": {
        "model": "resnet_custom_v4", "checkpoint_frequency_mb": 50,
        "minibatch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
        "loss": "binary_crossentropy", "rotation_range": [0.0, 360.0], "scale_range": [0.9, 1.1],
        "shift_range": [-0.1, 0.1],
    },
    # Our best ResNet recipe: sample-project's, tuned on the basic sample (docs/sample.md), its schedule
    # (drops after 2/3 and 11/12 of the epochs) stretched from 12 to the 40 epochs resnet_small trains in
    # 10 minutes on the idle 2-core machine (12 took 176 s: docs/performance.md).
    "resnet_small": {
        "model": "resnet_small", "checkpoint_frequency_mb": 300,
        "minibatch_size": 32, "optimizer": "adam", "learning_rate": 0.002,
        "learning_rates": [{"used_epoch": 27, "learning_rate": 0.0005}, {"used_epoch": 37, "learning_rate": 0.0002}],
        "epoch_count": 40, "loss": "binary_crossentropy", "rotation_range": [0.0, 360.0],
        "scale_range": [0.9, 1.1], "shift_range": [-0.1, 0.1],
    },
    # create-project --recipe modern, as it stands (deepdanbooru/project/recipes.py): resnet_small's
    # 40-epoch step schedule with AdamW and ASL (it reached its 40 epochs in 8.5 of the 10 minutes).
    "modern": {**MODERN, "checkpoint_frequency_mb": 300},
}
BASELINES = {"ddb": "deepdanbooru", "resnet": "resnet_small"}
DEFAULT_RECIPES = ("deepdanbooru", "resnet_small", "modern")
METRICS = ("macro_f1", "micro_f1", "map")
LABELS = {"macro_f1": "macro-F1", "micro_f1": "micro-F1", "map": "mAP"}
# macro-F1 at other thresholds, printed in a second table: a loss that only shifts the scores (ASL) moves
# macro-F1 at 0.5 without ranking better, and these show it (docs/quality.md). pr_threshold says where P=R is.
THRESHOLD_METRICS = ("macro_f1_040", "pr_f1", "pr_threshold", "calibrated_macro_f1")
GRACE_SECONDS = 120  # after SIGINT, or past the limit with --time-limit, before the child is killed


class BenchError(Exception):
    pass


# Recipe entries that are not project.json keys but arguments of the run.
RUN_KEYS = ("source_model",)


def project_json(recipe: dict, size: int, database: Path | None = None, base: dict | None = None) -> dict:
    config = {**(base or BASE), "image_width": size, "image_height": size,
              "database_path": str(database or "dataset.sqlite"),
              **{key: value for key, value in recipe.items() if key not in RUN_KEYS}}
    # Exports only at the end (epoch_count "fit" plans a number no recipe can know: no epoch reaches BASE's).
    epochs = config["epoch_count"]
    config.setdefault("export_model_per_epoch", epochs if isinstance(epochs, int) else BASE["epoch_count"])
    return config


def check_recipes(names: list[str], recipes: dict[str, dict], project_dir: Path, size: int = 64) -> None:
    """Refuse, before anything trains, a recipe the installed deepdanbooru cannot run as written."""
    from deepdanbooru.errors import UserError
    from deepdanbooru.models.table import check_model_input
    from deepdanbooru.project.config import KEY_BY_NAME, parse_config

    problems = []
    for name in names:
        if name not in recipes:
            problems.append(f"recipe {name!r} is not defined (known: {', '.join(recipes)})")
            continue
        source = recipes[name].get("source_model")
        if source is not None and not Path(source).is_file():
            problems.append(f"recipe {name!r}: source_model {source} is not a file")
            continue
        raw = project_json(recipes[name], size)
        unknown = sorted(key for key in raw if key not in KEY_BY_NAME)
        if unknown:
            problems.append(f"recipe {name!r}: the installed deepdanbooru ({ROOT}) does not know the key(s) "
                            f"{', '.join(unknown)}")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                config = parse_config(raw, project_dir, project_dir / f"{name}.project.json")
            check_model_input(config.model, config.input_shape, source=config.config_path)
        except UserError as error:  # a value it does not take, a model refusing this size
            problems.append(f"recipe {name!r}: {error}")
    if problems:
        raise BenchError("refusing to run:\n  " + "\n  ".join(problems))


def has_time_limit(env) -> bool:
    """Whether the installed train-project takes --time-limit."""
    done = subprocess.run([sys.executable, "-m", "deepdanbooru", "train-project", "--help"], env=env,
                          capture_output=True, text=True, check=False)
    return "--time-limit" in done.stdout


def make_dataset(work: Path, count: int, size: int, seed: int) -> tuple[Path, list[str]]:
    from deepdanbooru.errors import UserError
    from deepdanbooru.sample.generator import generate_sample_dataset

    try:
        return generate_sample_dataset(work / "dataset", count=count, size=size, seed=seed, preset="hard",
                                       reuse_identical=True)
    except UserError as error:  # e.g. --work holds a dataset made with other options
        raise BenchError(str(error)) from None


def own_dataset(directory: Path) -> tuple[Path, list[str], dict]:
    """(database, tags, BASE with its image extensions) of a Danbooru-style dataset folder."""
    import sqlite3

    directory = directory.resolve()  # project.json resolves a relative database_path against the project
    database, tags_file = directory / "dataset.sqlite", directory / "tags.txt"
    for path in (database, tags_file):
        if not path.is_file():
            raise BenchError(f"--dataset: {path} is not a file")
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        extensions = sorted(row[0] for row in connection.execute("SELECT DISTINCT file_ext FROM posts"))
    finally:
        connection.close()
    tags = [line.strip() for line in tags_file.read_text().splitlines() if line.strip()]
    return database, tags, {**BASE, "image_extensions": extensions}


def source_arguments(recipe: dict) -> list[str]:
    """train-project's --source-model (and --source-tags, when import-model's list lies beside it)."""
    source = recipe.get("source_model")
    if source is None:
        return []
    source = Path(source).resolve()
    tags = source.with_name(source.name.removesuffix(".keras") + ".tags.txt")
    return ["--source-model", str(source)] + (["--source-tags", str(tags)] if tags.is_file() else [])


def write_project(directory: Path, recipe: dict, database: Path, tags: list[str], size: int,
                  base: dict | None = None) -> None:
    directory.mkdir(parents=True)
    config = project_json(recipe, size, database, base)
    (directory / "project.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "tags.txt").write_text("\n".join(tags) + "\n")


def train(project: Path, budget: float, use_time_limit: bool, env, log, extra=()) -> dict:
    """Run train-project for the budget; return how it ended."""
    argv = [sys.executable, "-m", "deepdanbooru", "train-project", str(project), *extra]
    if use_time_limit:
        argv += ["--time-limit", f"{int(budget)}s"]
    started_wall, started = time.time(), time.monotonic()
    with open(log, "w") as output:
        child = subprocess.Popen(argv, env=env, stdout=output, stderr=subprocess.STDOUT)
        stopped = False
        deadline = budget + (GRACE_SECONDS if use_time_limit else 0)
        try:
            child.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            if not use_time_limit:
                child.send_signal(signal.SIGINT)
                stopped = True
            try:
                child.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    seconds = time.monotonic() - started
    expected = (0, 130) if stopped else (0,)
    if child.returncode not in expected:
        tail = Path(log).read_text(errors="replace").splitlines()[-20:]
        raise BenchError(f"{project}: train-project exited with {child.returncode}:\n" + "\n".join(tail))
    if stopped:
        ended = "signal"
    elif "Stopped for the time limit" in Path(log).read_text(errors="replace"):
        ended = "time-limit"
    else:
        ended = "finished"  # epoch_count reached within the budget
    return {"started": started_wall, "seconds": round(seconds, 1), "stopped_by": ended,
            "exit_code": child.returncode}


def curve(project: Path, started: float, budget: float | None) -> list[dict]:
    """The validations of the run (within the budget, if given), with minutes since start."""
    from deepdanbooru.training.history import read_history

    path = project / "logs" / "history.jsonl"
    if not path.is_file():
        return []
    points = []
    for record in read_history(path):
        if record.get("kind") != "validation":
            continue
        seconds = record["time"] - started
        if budget is not None and seconds > budget:  # one a signalled run still finished: too late
            continue
        points.append({"minutes": round(seconds / 60, 3), "used_epoch": record["used_epoch"],
                       "used_minibatch": record["used_minibatch"], "used_sample": record["used_sample"],
                       **{name: record.get(name) for name in (*METRICS, *THRESHOLD_METRICS, "validation_records")},
                       "seconds": record.get("seconds")})
    return points


def ratio(value, base) -> float | None:
    if value is None or not base:
        return None
    return value / base


def summarise(results: dict[str, dict]) -> dict[str, dict]:
    """The last point of each recipe, with ratios to the baselines that ran."""
    table = {}
    for name, result in results.items():
        last = result["curve"][-1] if result["curve"] else {}
        row = {"model": result["config"]["model"], "epochs": last.get("used_sample", 0) / result["train_records"]
               if result["train_records"] else 0.0, "samples": last.get("used_sample", 0),
               "minutes": last.get("minutes"), "stopped_by": result["run"]["stopped_by"],
               "validation_share": result["validation_share"],
               **{m: last.get(m) for m in (*METRICS, *THRESHOLD_METRICS)}}
        table[name] = row
    for row in table.values():
        for tag, baseline in BASELINES.items():
            for metric in METRICS:
                base = table.get(baseline, {}).get(metric)
                row[f"{metric}_vs_{tag}"] = ratio(row[metric], base)
    return table


def _cell(value, ratios) -> str:
    if value is None:
        return "n/a"
    parts = [f"{r:.2f}x" for r in ratios if r is not None]
    return f"{value:.4f}" + (f" ({', '.join(parts)})" if parts else "")


def markdown(table: dict[str, dict], budget: float) -> str:
    present = [tag for tag, name in BASELINES.items() if name in table]
    against = " and ".join({"ddb": "deepdanbooru", "resnet": "resnet_small"}[tag] for tag in present)
    lines = [f"Budget {budget / 60:g} min per recipe; in brackets the ratio to {against or 'no baseline'}.", "",
             "| recipe | model | epochs | samples | measured at (min) | macro-F1 | micro-F1 | mAP | validation share |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        cells = [_cell(row[m], [row[f"{m}_vs_{tag}"] for tag in present]) for m in METRICS]
        lines.append(f"| {name} | {row['model']} | {row['epochs']:.1f} | {row['samples']} | {row['minutes']:.1f} | "
                     + " | ".join(cells) + f" | {row['validation_share']:.0%} |")
    lines += ["", "macro-F1 at other thresholds (P=R: where macro precision equals macro recall; per-tag: each tag "
              "at its own best threshold on these posts, so optimistic):", "",
              "| recipe | at 0.5 | at 0.4 | at P=R (threshold) | per-tag thresholds |", "|---|---|---|---|---|"]
    for name, row in table.items():
        pr = _cell(row.get("pr_f1"), ())
        if row.get("pr_threshold") is not None:
            pr += f" ({row['pr_threshold']:.3f})"
        lines.append(f"| {name} | {_cell(row['macro_f1'], ())} | {_cell(row.get('macro_f1_040'), ())} | {pr} | "
                     f"{_cell(row.get('calibrated_macro_f1'), ())} |")
    return "\n".join(lines) + "\n"


def plots(results: dict[str, dict], out: Path) -> list[Path]:
    written = []
    for name, result in results.items():
        path = out / f"{name}.png"
        line_chart(path, {LABELS[m]: [(p["minutes"], p[m]) for p in result["curve"] if p[m] is not None]
                          for m in METRICS},
                   title=f"{name} ({result['config']['model']})", x_label="minutes", y_label="validation",
                   y_range=(0.0, 1.0))
        written.append(path)
    # macro-F1 at 0.5 moves with the loss's calibration, mAP only with the ranking: one chart each.
    for path, metric in ((out / "curves.png", "macro_f1"), (out / "curves-map.png", "map")):
        line_chart(path, {name: [(p["minutes"], p[metric]) for p in result["curve"] if p[metric] is not None]
                          for name, result in results.items()},
                   title=f"{LABELS[metric]} at equal time", x_label="minutes", y_label=LABELS[metric],
                   y_range=(0.0, 1.0))
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=600.0, help="seconds of wall-clock time per recipe")
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES), help="comma-separated recipe names")
    parser.add_argument("--recipes-file", type=Path,
                        help="JSON object {name: {project.json overrides}} added to (or replacing) the table's")
    parser.add_argument("--count", type=int, default=6000, help="posts in the hard sample")
    parser.add_argument("--size", type=int, default=64, help="image side, stored and trained")
    parser.add_argument("--seed", type=int, default=0, help="seed of the hard sample")
    parser.add_argument("--work", type=Path, help="where the dataset and the projects go [default: a temporary "
                                                   "folder, removed at the end]")
    parser.add_argument("--out", type=Path, default=Path("quality-results"), help="results folder")
    parser.add_argument("--stop", choices=("auto", "time-limit", "signal"), default="auto",
                        help="how a run ends at the budget (auto: --time-limit when train-project has it)")
    parser.add_argument("--dataset", type=Path, help="a Danbooru-style dataset folder (dataset.sqlite, images/, "
                                                     "tags.txt) instead of the hard sample")
    parser.add_argument("--held-back", type=Path, help="tags (one a line) scored alone on each final export too")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="QUALITY.json",
                        help="train nothing: the tables and charts of the runs in these earlier quality.json files")
    args = parser.parse_args(argv)

    if args.merge:
        held_back = args.held_back.read_text().split() if args.held_back else None
        return merge(args.merge, args.out, held_back)
    recipes = dict(RECIPES)
    if args.recipes_file:
        recipes.update(json.loads(args.recipes_file.read_text()))
    names = [name.strip() for name in args.recipes.split(",") if name.strip()]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory(prefix="quality-") as scratch:
        work = args.work or Path(scratch)
        try:
            check_recipes(names, recipes, work, args.size)
            use_time_limit = {"auto": None, "time-limit": True, "signal": False}[args.stop]
            if use_time_limit is None:
                use_time_limit = has_time_limit(env)
            elif use_time_limit and not has_time_limit(env):
                raise BenchError("--stop time-limit: the installed train-project has no --time-limit")
            taken = [str(work / "runs" / name) for name in names if (work / "runs" / name).exists()]
            if taken:
                raise BenchError(f"{', '.join(taken)} exist(s); remove them or pick another --work")
            work.mkdir(parents=True, exist_ok=True)
            args.out.mkdir(parents=True, exist_ok=True)
            made = time.monotonic()
            if args.dataset:
                database, tags, base = own_dataset(args.dataset)
            else:
                database, tags = make_dataset(work, args.count, args.size, args.seed)
                base = BASE
            print(f"dataset: {database} ({len(tags)} tags, {time.monotonic() - made:.0f} s)")
            held_back = None
            if args.held_back:
                held_back = [line.strip() for line in args.held_back.read_text().splitlines() if line.strip()]
        except BenchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        results, failed = {}, {}
        for name in names:
            project = work / "runs" / name
            write_project(project, recipes[name], database, tags, args.size, base)
            print(f"{name}: training for {args.budget:g} s "
                  f"({'--time-limit' if use_time_limit else 'SIGINT at the budget'}) ...", flush=True)
            try:
                results[name] = measure(project, args.budget, use_time_limit, env, source_arguments(recipes[name]))
            except BenchError as error:  # the others still run: each is minutes of work
                print(f"error: {name}: {error}", file=sys.stderr, flush=True)
                failed[name] = str(error)
                continue
            run, last = results[name]["run"], results[name]["curve"][-1]
            if run["stopped_by"] == "finished":
                print(f"warning: {name} reached its epoch_count after {run['seconds']:.0f} s, before the "
                      "budget; raise it (and stretch its schedule) to compare at equal time", flush=True)
            print(f"{name}: {run['stopped_by']} after {run['seconds']:.0f} s; last validation at "
                  f"{last['minutes']:.1f} min: " + ", ".join(f"{LABELS[m]} {last[m]:.4f}" for m in METRICS),
                  flush=True)
        if not results:
            return 1
        held_out = {name: result["curve"][-1]["validation_records"] for name, result in results.items()}
        if len(set(held_out.values())) > 1:
            print(f"warning: the recipes were validated on different numbers of posts {held_out}: a recipe "
                  "overrides a key of the split (validation_fraction, seed, minimum_tag_count, image_extensions)")
        table = summarise(results)
        text = markdown(table, args.budget)
        if held_back is not None:
            text += held_back_table(results, held_back)
        (args.out / "quality.md").write_text(text)
        (args.out / "quality.json").write_text(json.dumps(
            {"budget_seconds": args.budget, "count": args.count, "size": args.size, "seed": args.seed,
             "stop": "time-limit" if use_time_limit else "signal", "table": table, "runs": results,
             "held_back_tags": held_back,
             "failed": failed}, indent=2))
        written = plots(results, args.out)
        print()
        print(text)
        print(f"written: {args.out / 'quality.json'}, {args.out / 'quality.md'}, "
              + ", ".join(str(p) for p in written))
        if failed:
            print(f"failed: {', '.join(failed)} (see above)", file=sys.stderr)
    return 1 if failed else 0


def held_back_table(results: dict[str, dict], held_back: list[str]) -> str:
    """Each run's final export measured again (unless results hold it): all tags, then the held-back ones alone."""
    from held_back import subset_scores

    lines = ["", f"Final exports on the validation split: all tags, and the {len(held_back)} held-back tags alone "
             "(P=R and per-tag thresholds as above):", "",
             "| recipe | mAP | macro-F1 at P=R | per-tag thresholds | held-back mAP | held-back at P=R | "
             "held-back per-tag | held-back tags scored |", "|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        if "held_back" not in result:
            result["held_back"] = subset_scores(Path(result["project"]), held_back)
        scores = result["held_back"]
        cells = [_cell(scores[part][figure], ()) for part in ("all", "held_back")
                 for figure in ("map", "pr_f1", "calibrated_macro_f1")]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {scores['held_back_tags']} |")
    return "\n".join(lines) + "\n"


def merge(files: list[Path], out: Path, held_back: list[str] | None = None) -> int:
    """One table and one set of charts from runs of several invocations (same data, same budget)."""
    results, budgets = {}, set()
    for path in files:
        saved = json.loads(path.read_text())
        budgets.add(saved["budget_seconds"])
        held_back = saved.get("held_back_tags", held_back)
        for name, result in saved["runs"].items():
            if name in results:
                print(f"error: {path}: recipe {name!r} is in an earlier file too", file=sys.stderr)
                return 2
            results[name] = result
    if len(budgets) > 1:
        print(f"error: the files' budgets differ ({sorted(budgets)} s): not an equal-time comparison", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(summarise(results), budgets.pop())
    if held_back is not None and all("held_back" in result for result in results.values()):
        text += held_back_table(results, held_back)
    (out / "quality.md").write_text(text)
    written = plots(results, out)
    print(text)
    print(f"written: {out / 'quality.md'}, " + ", ".join(str(p) for p in written))
    return 0


def measure(project: Path, budget: float, use_time_limit: bool, env, extra=()) -> dict:
    """Train one recipe's project for the budget and read its curve."""
    run = train(project, budget, use_time_limit, env, project / "train.log", extra)
    # --time-limit keeps its own time (from a moment after the process starts): all its
    # validations count; a signalled run's count up to the signal.
    points = curve(project, run["started"], None if use_time_limit else budget)
    if not points:
        raise BenchError(f"{project}: no validation within the budget; see {project / 'train.log'}")
    config = json.loads((project / "project.json").read_text())
    validation = sum(p["seconds"] or 0 for p in points)
    return {"config": config, "run": run, "curve": points, "train_records": _train_records(project),
            "project": str(project), "source_model": extra[1] if extra else None,
            "validation_share": validation / run["seconds"]}


def _train_records(project: Path) -> int:
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.project.config import load_config
    from deepdanbooru.scoring.split import split_records

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = load_config(project)
    records = load_records(config.require_database(), config.minimum_tag_count, config.image_extensions)
    return len(split_records(records, config.validation_fraction, config.seed)[0])


if __name__ == "__main__":
    sys.exit(main())
