"""The run in rows of text, and which tags each headline figure covers (standard library only)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.inference.project_metrics import group_mean_text
from deepdanbooru.project.config import KEYS, PROJECT_FILE

# A pause between two history lines longer than this, beyond the training and validation they account for,
# is drawn as a stop when no stop is recorded there (histories written before runs recorded their stops).
STOP_SECONDS = 60.0
RUN_KINDS = ("train", "validation")
# How the page names what stopped a run (the trainer's history.py writes the keys).
STOP_WORDS = {"Ctrl-C": "Ctrl-C", "time limit": "the time limit",
              "killed": "killed or crashed (no stop recorded)"}


@dataclass(frozen=True)
class Stop:
    step: int  # where the run went on from: its checkpoint's step (or where it stands, not resumed yet)
    seconds: float | None  # paused until the resume; None: not resumed yet, or not known
    reason: str  # a STOP_WORDS key, or "pause" for a gap seen in the times alone
    reached: int  # the step the stopped run had reached
    resumed: bool = True

    @property
    def label(self) -> str:
        """A chart's word for it: the reason as the history names it."""
        return self.reason

    def text(self) -> str:
        if self.reason == "pause":
            return (f"a pause of {_duration(self.seconds or 0)} at step {self.step:,} (seen in the times; "
                    "no stop recorded)")
        what = f"{STOP_WORDS.get(self.reason, self.reason)} at step {self.reached:,}"
        if not self.resumed:
            return f"{what}, not resumed yet"
        after = f" after {_duration(self.seconds)}" if self.seconds is not None else ""
        again = self.reached - self.step
        repeated = f" ({again:,} step{'s' if again != 1 else ''} trained again)" if again > 0 else ""
        return f"{what}, resumed from the checkpoint at step {self.step:,}{after}{repeated}"


def _number(row: dict, key: str):
    value = row.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stops(history: list[dict]) -> list[Stop]:
    """The run's stops in step order: each "resume" line (how the run before it stopped), a last "stop" line
    not resumed yet, and for lines without either between them, a pause where the time between two lines
    exceeds what they account for by more than STOP_SECONDS (a train line accounts for its records at its
    samples_per_second, a validation line for its own seconds)."""
    found = []
    for before, after in zip(history, history[1:]):
        if after.get("kind") == "resume":
            resumed, stopped = _number(after, "time"), _number(after, "stopped_time")
            step = _number(after, "used_minibatch")
            if step is None:
                continue
            reached = _number(after, "stopped_step")
            found.append(Stop(int(step), resumed - stopped if resumed is not None and stopped is not None else None,
                              str(after.get("stopped_by") or "killed"), int(reached if reached is not None else step)))
            continue
        if before.get("kind") not in RUN_KINDS or after.get("kind") not in RUN_KINDS:
            continue
        try:
            elapsed = float(after["time"]) - float(before["time"])
            step = int(after["used_minibatch"])
            if after.get("kind") == "validation":
                accounted = float(after.get("seconds") or 0.0)
            else:
                rate = float(after.get("samples_per_second") or 0)
                samples = float(after.get("used_sample") or 0) - float(before.get("used_sample") or 0)
                accounted = samples / rate if rate > 0 and samples > 0 else 0.0
        except (KeyError, TypeError, ValueError):
            continue
        if elapsed - accounted > STOP_SECONDS:
            found.append(Stop(step, elapsed - accounted, "pause", step))
    last = history[-1] if history else {}
    if last.get("kind") == "stop" and _number(last, "used_minibatch") is not None:
        step = int(last["used_minibatch"])
        found.append(Stop(step, None, str(last.get("reason") or "killed"), step, resumed=False))
    return found


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def changed_keys(project_dir: Path) -> list[tuple[str, object, object]]:
    """(key, value, default) for each project.json key set to other than its default, in the key table's order."""
    try:
        raw = json.loads((Path(project_dir) / PROJECT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for key in KEYS:
        if key.name in raw and raw[key.name] != _plain(key.default):
            out.append((key.name, raw[key.name], _plain(key.default)))
    return out


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _figure(metrics: dict | None, name: str) -> str:
    value = (metrics or {}).get(name)
    return f"{value:.4f}" if isinstance(value, (int, float)) else "n/a"


def model_text(config, state: dict) -> str:
    """The network that trained, by the name its checkpoints and exports give it, and its size (state.json);
    project.json's model only where the run trained that (or recorded nothing)."""
    network, counts = state.get("network"), state.get("parameters")
    size = f"{config.image_width}x{config.image_height}"
    if not isinstance(network, str) or not network:
        return f"{config.model}, {size}"
    text = f"{network}, {size}"
    if isinstance(counts, dict) and all(isinstance(counts.get(key), int) for key in ("trainable", "non_trainable")):
        text += (f", {counts['trainable'] + counts['non_trainable']:,} parameters ({counts['trainable']:,} "
                 "trainable)")
    if state.get("source"):
        text += f"; the --source-model's network (project.json's model {config.model} did not train)"
    return text


def run_rows(config, files, model_kind: str, model_file: Path, split: dict) -> list[tuple[str, str]]:
    """The run section: (label, text) rows."""
    state = files.state or {}
    rows = [("Model", model_text(config, state)), ("Reported model", f"{model_file.name} ({model_kind})")]
    source = state.get("source")
    if source:
        start = f"fine-tuned from --source-model {source}"
    elif config.backbone_weights is not None:
        start = f"backbone weights {config.backbone_weights}, head from scratch"
    elif state:
        start = "from scratch"
    else:
        start = "unknown (no checkpoints/state.json)"
    rows.append(("Started", start))
    rows.append(("Data", f"{split['train']:,} training and {split['validation']:,} validation posts "
                         f"(validation_fraction {config.validation_fraction:g}), {split['tags']:,} tags"))
    if state:
        done = "complete" if state.get("complete") else "not complete"
        rows.append(("Epochs", f"{state.get('used_epoch')} of {state.get('epoch_count')} ({done}), "
                               f"{state.get('used_minibatch'):,} steps"))
    history = files.history
    if history:
        paused = stops(history)
        first, last = history[0].get("time"), history[-1].get("time")
        if isinstance(first, (int, float)) and isinstance(last, (int, float)):
            active = last - first - sum(stop.seconds or 0.0 for stop in paused)
            rows.append(("Time", f"{_duration(active)} training and validating, from "
                                 f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(first))} to "
                                 f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(last))} UTC"))
        rows.append(("Stops", f"{len(paused)}: " + "; ".join(stop.text() for stop in paused) if paused else
                     f"none (none recorded, and no pause over {STOP_SECONDS:.0f} s in the history)"))
    best = files.best
    if best:
        rows.append(("Best", f"{best.get('metric')} {_figure(best, 'value')} at step {best.get('used_minibatch')} "
                             f"(epoch {best.get('used_epoch')})"))
    validations = files.validation_rows
    if validations:
        final = validations[-1]
        rows.append(("Last validation", f"step {final.get('used_minibatch')}: mAP {_figure(final, 'map')}, "
                                        f"macro-F1 {_figure(final, 'macro_f1')}, "
                                        f"calibrated macro-F1 {_figure(final, 'calibrated_macro_f1')}"))
    changed = changed_keys(config.project_dir)
    rows.append(("Settings changed from the defaults",
                 "; ".join(f"{name} {json.dumps(value)} (default {json.dumps(default)})"
                           for name, value, default in changed) or "none"))
    return rows


def kept_rows(source: dict | None, tags, result: dict, records: int) -> list[tuple[str, str, str]]:
    """The figure row of what a fine-tune kept of the tags its source knew (scoring.kept), where the source was
    measured on these validation posts (logs/source_tag_ap.json of as many records); none otherwise."""
    from deepdanbooru.scoring.kept import kept_on, kept_summary

    if not isinstance(source, dict) or not isinstance(source.get("ap"), dict) \
            or source.get("validation_records") != records:
        return []
    figures = kept_on(source["ap"], tags, result["per_tag"])
    value = f"{len(figures.lost)} of {figures.measured} lost" if figures.measured else "not counted"
    return [("source tags kept", value, f"{kept_summary(figures)}; AP against the source's before the first "
             f"step, on the same validation posts (the tag table's source model AP column)")]


def figure_rows(result: dict) -> list[tuple[str, str, str]]:
    """(figure, value, the tags it averages over and at which thresholds) for the headline figures."""
    with_positives = result["tags_with_positives"]
    calibrated = result["calibrated_tags"]
    rest = with_positives - calibrated
    tags = f"the {with_positives:,} tags with a positive in the split (of {result['tags']:,})"

    def shown(name):
        return group_mean_text(name, result)

    return [
        ("mAP", f"{result['map']:.4f}", f"{tags}; no threshold"),
        ("macro-F1", f"{result['macro_f1']:.4f}", f"{tags}, each at the working threshold {result['threshold']:g}"),
        ("calibrated macro-F1", f"{result['calibrated_macro_f1']:.4f}",
         f"{tags}: {calibrated:,} at their own F1-best threshold (where validation supports one: at least "
         f"{result['min_support']} positives, an AP and a gain over {result['threshold']:g}), {rest:,} at the "
         f"fallback {result.get('fallback_threshold', result['global_threshold']):g} or withheld "
         f"({result.get('withheld_tags', 0):,} tags never emitted), as the *.thresholds.csv gives them to evaluate. "
         f"The calibrated tags: {shown('calibrated_tags_f1')} (at {result['threshold']:g}: "
         f"{shown('calibrated_tags_f1_at_threshold')}); the others: {shown('fallback_tags_f1')} "
         f"(at {result['threshold']:g}: {shown('fallback_tags_f1_at_threshold')})"),
        ("macro-F1 at P=R", f"{result['pr_f1']:.4f}",
         f"{tags}, all at the one threshold {result['pr_threshold']:g} where macro precision equals macro recall"),
        ("micro-F1", f"{result['micro_f1']:.4f}", f"every (picture, tag) pair at {result['threshold']:g}"),
    ]
