"""What a fine-tune kept of its source: per-tag AP before the first step against after, and WiSE-FT mixes.

    python bench/forgetting.py PROJECT [PROJECT ...] --source-model SOURCE.keras [--source-tags TAGS.txt]
                               [--alphas 0,0.25,0.5,0.75,1] [--out forgetting.json]

Each PROJECT is a finished fine-tune (bench/quality.py's runs/<recipe>): its logs/source_tag_ap.json
holds the source's AP per tag it shares with tags.txt, measured by the run on its validation split
before the first step. Its best export (the one evaluate-project picks) and its last one (final, or
the --time-limit stop's) are measured on the same posts the same way (scoring.scorer.measure), and
compared tag by tag:

- known tags: those the source knew with at least --min-positives (10) positives in the split; how
  many lost more than --loss (0.02) AP, how many gained, their mean AP before and after;
- new tags: those the source did not know, with positives: their mean AP (learnt or not);
- all tags with positives: mAP.

--alphas also measures weight-space mixes of the start and the last export, (1 - a) * start + a * export
for every weight (WiSE-FT), the start being the source with its head mapped onto tags.txt as the
trainer maps it (a = 0 is the start: its figures must equal source_tag_ap.json's; a = 1 the export).
This is what the run's own `wise_ft` does at its end, measured here on a run made without it.
--head-alphas gives the head's rows of the tags the source knew a mix of their own (every pair of
--alphas and --head-alphas, keyed 'a/h'); --halves measures every mix again on each half of the
validation posts (every other post), so that a mix chosen on one half can be scored on the other
(bench/forgetting_choice.py). The output holds every mix's per-tag AP under "per_tag_ap".

--ensembles measures output-space mixes instead: both networks run, and each tag's score is
sigmoid((1 - w) * logit(start) + w * logit(trained)) (keys 'ens<w>'); a new tag's start score is its
prior, the same for every picture, so its ranking (AP) is the trained network's. The trained weights are
the last export's; where that export holds a wise_ft mix (its metrics.json names the mix a), they are
recovered from it, start + (mix - start) / a, so a wise_ft run is measured at exactly its training.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def goals(source_ap: dict, support: dict, ap: dict, new_tags: list[str], min_positives: int = 10,
          loss: float = 0.02) -> dict:
    """The keeping figures from per-tag APs: source_ap/support over the known tags, ap over every tag. The known
    tags are counted as train-project's closing "Kept from the source" line counts them (scoring.kept)."""
    from deepdanbooru.scoring.kept import kept

    known = kept(source_ap, support, ap, min_positives, loss)
    new = [ap[tag] for tag in new_tags if ap.get(tag) is not None]
    every = [value for value in ap.values() if value is not None]
    measured = known.measured > 0
    return {
        "known_tags": known.measured,
        "known_lost": len(known.lost),
        "known_lost_share": len(known.lost) / known.measured if measured else None,
        "known_gained": known.gained,
        "known_map_before": known.before,
        "known_map_after": known.after,
        "known_map_rise": known.after - known.before if measured else None,
        "new_tags": len(new),
        "new_map": float(np.mean(new)) if new else None,
        "map": float(np.mean(every)) if every else None,
    }


class Measurer:
    """A project's validation split, ready to measure any model of its tags."""

    def __init__(self, project: Path, batch_size: int = 64, half: int | None = None):
        from deepdanbooru.inference.project_metrics import select_records
        from deepdanbooru.models.losses import project_loss
        from deepdanbooru.pipeline import Fill, inference_dataset
        from deepdanbooru.project.config import load_config
        from deepdanbooru.project.tags import load_tags

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.config = load_config(project)
        self.tags = load_tags(self.config.project_dir / "tags.txt")
        records = select_records(self.config, "validation")
        if half is not None:  # every other post of the split, from the first (0) or the second (1)
            records = records.subset(range(half, len(records), 2))
        self.records = len(records.paths())
        self.loss = project_loss(self.config, "none")
        self.dataset = inference_dataset(records.paths(), height=self.config.image_height,
                                         width=self.config.image_width, batch_size=batch_size,
                                         max_image_pixels=self.config.max_image_pixels,
                                         tag_strings=list(records.tag_strings), tags=self.tags,
                                         fill=Fill.from_config(self.config))

    def ap(self, model) -> dict:
        """tag -> AP (None without positives)."""
        from deepdanbooru.scoring.scorer import BatchScorer, measure

        scorer = BatchScorer(model, self.loss, self.config.image_height, self.config.image_width)
        per_tag = measure(scorer, self.dataset, self.config.validation_threshold).result()["per_tag"]
        return {tag: (float(value) if np.isfinite(value) else None) for tag, value in zip(self.tags, per_tag["ap"])}


def start_model(project: Path, source: Path, source_tags: Path | None, measurer: Measurer):
    """The source with its head mapped onto the project's tags.txt, new tags at their prior: the trainer's start."""
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.models.head import grow_vocabulary
    from deepdanbooru.models.vocabulary import read_model_tags
    from deepdanbooru.project.tags import load_tags, tag_counts
    from deepdanbooru.dataset.records import load_records
    from deepdanbooru.scoring.split import split_records
    from deepdanbooru.training.priors import log_odds
    from deepdanbooru.training.source import in_project_spelling

    config = measurer.config
    records = load_records(config.require_database(), config.minimum_tag_count, config.image_extensions)
    train = split_records(records, config.validation_fraction, config.seed)[0]
    priors = log_odds(tag_counts(train.tag_strings, measurer.tags), len(train))
    names = load_tags(source_tags) if source_tags else read_model_tags(source)
    model = load_model_file(source)
    grown, _ = grow_vocabulary(model, in_project_spelling(names, measurer.tags), measurer.tags, priors, source)
    return grown, names


def mixed(start, end, alpha: float, into, head=None) -> None:
    """into's weights = (1 - alpha) * start + alpha * end, layer by layer (matched by name). head, if given, is
    (layer name, the known tags' output columns, their own alpha): those columns of the head's kernel and bias
    mix at that alpha instead, the rest of the head and every other layer at `alpha`."""
    for layer in into.layers:
        if not layer.weights:
            continue
        a = start.get_layer(layer.name).get_weights()
        b = end.get_layer(layer.name).get_weights()
        out = [(1.0 - alpha) * x + alpha * y if np.issubdtype(y.dtype, np.floating) else y for x, y in zip(a, b)]
        if head is not None and layer.name == head[0]:
            columns, rate = head[1], head[2]
            for x, y, mix in zip(a, b, out):
                mix[..., columns] = (1.0 - rate) * x[..., columns] + rate * y[..., columns]
        layer.set_weights(out)


class LogitEnsemble:
    """Scores sigmoid((1 - weight) * logit(start) + weight * logit(end)): an output-space ensemble of two models."""

    def __init__(self, start, end, weight: float):
        self.start, self.end, self.weight = start, end, float(weight)
        self.output_shape = end.output_shape

    def __call__(self, images, training=False):
        import tensorflow as tf

        def logit(scores):
            scores = tf.clip_by_value(tf.cast(scores, tf.float32), 1e-7, 1.0 - 1e-7)
            return tf.math.log(scores) - tf.math.log1p(-scores)

        return tf.sigmoid((1.0 - self.weight) * logit(self.start(images, training=False))
                          + self.weight * logit(self.end(images, training=False)))


def mixed_alpha(export: Path) -> float:
    """The wise_ft mix an export holds (1: the trained weights), from its metrics.json."""
    metrics = export.with_name(export.name[: -len(".keras")] + ".metrics.json")
    if not metrics.exists():
        return 1.0
    return float(json.loads(metrics.read_text()).get("wise_ft", {}).get("alpha", 1.0))


def last_export(project: Path) -> Path:
    """The run's last weights: its final export, else the one its --time-limit stop wrote."""
    finals = [p for p in project.glob("model-*.keras") if p.name.count(".") == 1]
    stopped = list(project.glob("model-*.stopped.keras"))
    if not finals and not stopped:
        raise SystemExit(f"error: {project} has no final or stopped export")
    return (finals or stopped)[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", type=Path, nargs="+")
    parser.add_argument("--source-model", type=Path, required=True)
    parser.add_argument("--source-tags", type=Path)
    parser.add_argument("--alphas", default="1", help="comma-separated WiSE-FT mixing weights (1: the export)")
    parser.add_argument("--head-alphas", help="comma-separated mixing weights for the known tags' rows of the head "
                        "alone, each measured with every --alphas for the rest of the network (keys 'a/h')")
    parser.add_argument("--halves", action="store_true", help="also measure each mix on every other validation post "
                        "(the first and the second half, per_tag_ap keys 'a@half0', 'a@half1'): a mix chosen on one "
                        "half is scored on posts that did not choose it")
    parser.add_argument("--ensembles", help="comma-separated output-space weights w of the trained network (keys "
                        "'ens<w>'), each tag scored sigmoid((1 - w) logit(start) + w logit(trained))")
    parser.add_argument("--min-positives", type=int, default=10)
    parser.add_argument("--also-min-positives", type=int, help="the known-tag figures again at this minimum")
    parser.add_argument("--loss", type=float, default=0.02)
    parser.add_argument("--out", type=Path, default=Path("forgetting.json"))
    args = parser.parse_args(argv)

    import keras

    from deepdanbooru.captions import tag_key
    from deepdanbooru.inference.model_files import resolve_model_files
    from deepdanbooru.inference.predict import configure_devices
    from deepdanbooru.models.files import load_model_file
    from deepdanbooru.models.head import head_layer

    configure_devices(False)
    alphas = [float(a) for a in args.alphas.split(",")]
    head_alphas = [float(a) for a in args.head_alphas.split(",")] if args.head_alphas else [None]
    results = {}
    for project in args.projects:
        start_file = json.loads((project / "logs" / "source_tag_ap.json").read_text())
        measurer = Measurer(project)
        halves = [Measurer(project, half=half) for half in (0, 1)] if args.halves else []
        best = resolve_model_files(project).model  # the export evaluate-project uses: the best one
        export = last_export(project)
        end = load_model_file(export)
        start, names = start_model(project, args.source_model, args.source_tags, measurer)
        held = mixed_alpha(export)
        if held != 1.0:  # a wise_ft export: measure mixes and ensembles of the weights it trained
            trained = keras.models.clone_model(end)
            mixed(start, end, 1.0 / held, trained)  # start + (mix - start) / a: the weights the mix was made of
            end = trained
        known = {tag_key(tag) for tag in names}
        new_tags = [tag for tag in measurer.tags if tag_key(tag) not in known]
        work = keras.models.clone_model(end)
        head = head_layer(end).name
        known_columns = np.array([i for i, tag in enumerate(measurer.tags) if tag_key(tag) in known], dtype=np.int64)
        rows, per_tag = {}, {}
        ensembles = [("ens", float(w)) for w in args.ensembles.split(",")] if args.ensembles else []
        for alpha, rate in [("best", None), *((a, h) for a in alphas for h in head_alphas), *ensembles]:
            key = alpha if alpha == "best" else f"ens{rate:g}" if alpha == "ens" else \
                f"{alpha:g}" + ("" if rate is None else f"/{rate:g}")
            if alpha == "best":
                scored, name = load_model_file(best), f"best export ({best.name})"
            elif alpha == "ens":
                scored, name = LogitEnsemble(start, end, rate), f"{key}: start + {export.name} (trained)"
            else:
                mixed(start, end, alpha, work, None if rate is None else (head, known_columns, rate))
                scored, name = work, f"a={key} of {export.name}"
            ap = per_tag[key] = measurer.ap(scored)
            if halves and alpha != "best":
                for half, part in enumerate(halves):
                    per_tag[f"{key}@half{half}"] = part.ap(scored)
            rows[key] = goals(start_file["ap"], start_file["support"], ap, new_tags, args.min_positives, args.loss)
            row = rows[key]
            if args.also_min_positives:  # the same figures over the known tags of fewer positives too
                wider = goals(start_file["ap"], start_file["support"], ap, new_tags, args.also_min_positives, args.loss)
                row["wider"] = {"min_positives": args.also_min_positives,
                                **{k: v for k, v in wider.items() if k.startswith("known")}}
            print(f"{project.name} {name}: mAP {row['map']:.4f}; known tags ({row['known_tags']}) "
                  f"{row['known_map_before']:.4f} -> {row['known_map_after']:.4f}, lost {row['known_lost']} "
                  f"({row['known_lost_share']:.1%}), gained {row['known_gained']}; new tags ({row['new_tags']}) "
                  f"mAP {row['new_map']:.4f}", flush=True)
            if "wider" in row:
                wide = row["wider"]
                print(f"    known tags with >= {wide['min_positives']} positives ({wide['known_tags']}): "
                      f"{wide['known_map_before']:.4f} -> {wide['known_map_after']:.4f}, lost {wide['known_lost']} "
                      f"({wide['known_lost_share']:.1%}), gained {wide['known_gained']}", flush=True)
        results[str(project)] = {"export": str(export), "best": str(best), "validation_records": measurer.records,
                                 "source_map": start_file["map"], "held_mix": held, "alphas": rows, "per_tag_ap": per_tag}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
