"""train-project against the model-only bound, side by side in one run.

    python bench/train.py [--model resnet_custom_v4] [--size 128] [--batch 16] [--samples 320]
                          [--image-size 256] [--repeat 1]

Two fresh subprocesses, one after the other, so each one's peak RSS is its own:

- real: `python -m deepdanbooru train-project` on a generated project
  (--samples JPEG posts of --image-size pixels, one epoch, the default
  checkpoint cadence of 200 minibatches, final export);
- model-only: the same model, optimizer, batch size, strategy and compiled
  train step (deepdanbooru.training.step.TrainStep) on one in-memory batch
  repeated, timed after warm-up.

Reported: steady samples/s of each (the real one from the console's progress
lines, i.e. between the first and the last line, which excludes start-up,
tracing and the final checkpoint/export), whole-run samples/s of the real run
(process start to exit), peak RSS of each, and the checkpoint's wall time.
Ratios: steady = real steady / model-only steady; whole run = real whole-run /
model-only steady; rss = real / model-only. checkpoint_share projects the
measured checkpoint time onto the default cadence: c / (c + 200 * batch /
real steady rate). bound_whole_run_ratio is the same whole-run measure taken
of the model-only child itself (samples of its warm-up and timed steps over
its time from the first line of its script, before TensorFlow is imported,
to the end of the timed steps): the ceiling that TensorFlow's import, the
model's build, the trace and the first execution leave to any real run.
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CADENCE_MB = 200

MODEL_ONLY = r"""
import json, sys, time
started = time.monotonic()
sys.path.insert(0, sys.argv[1])
model_name, size, batch, samples, tag_count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
import keras, numpy as np, tensorflow as tf
from deepdanbooru.models import build_model, make_optimizer
from deepdanbooru.training.step import TrainStep
keras.utils.set_random_seed(0)
tf.config.experimental.enable_op_determinism()
from deepdanbooru.training.strategy import choose_strategy
strategy = choose_strategy()  # the trainer's choice, with its graph options (grappler off without a GPU)
with strategy.scope():
    model = build_model(model_name, (size, size, 3), tag_count, seed=0)
    optimizer = make_optimizer("adam", 0.001)
    optimizer.build(model.trainable_variables)
rng = np.random.default_rng(0)
element = {"image": rng.random((batch, size, size, 3), dtype=np.float32),
           "label": (rng.random((batch, tag_count)) < 0.2).astype(np.float32),
           "position": np.arange(batch, dtype=np.int64)}
dataset = tf.data.Dataset.from_tensors(element).repeat().prefetch(2)
distributed = strategy.experimental_distribute_dataset(dataset)
step = TrainStep(strategy, model, optimizer, "binary_crossentropy", loss_scaled=False)
step.bind(distributed.element_spec)
iterator = iter(distributed)
warmup = 3
for _ in range(warmup):
    step(next(iterator))
step.sums.read_window()  # waits for the warm-up steps
steps = max(1, samples // batch)
begin = time.monotonic()
for _ in range(steps):
    step(next(iterator))
done = step.sums.read_window()
end = time.monotonic()
assert int(done["samples"]) == steps * batch
print(json.dumps({"steady_samples_per_second": steps * batch / (end - begin),
                  "whole_seconds": end - started, "first_step_seconds": begin - started,
                  "whole_samples": (warmup + steps) * batch}))
"""


def _run(argv, cwd=None, env=None):
    """Run a child, stamping each stdout line with its arrival time; return (lines, seconds, peak RSS bytes)."""
    started = time.monotonic()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in child.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        tail = "\n".join(text for _, text in lines[-30:])
        raise SystemExit(f"{argv[:4]} failed with exit code {child.returncode}:\n{tail}")
    return lines, seconds, usage.ru_maxrss * 1024


def _make_project(directory: Path, args) -> Path:
    sys.path.insert(0, str(ROOT))
    from deepdanbooru.sample.generator import generate_sample_dataset

    database, tags = generate_sample_dataset(directory / "dataset", count=args.samples, size=args.image_size,
                                             seed=0)
    project = directory / "project"
    project.mkdir()
    config = {
        "image_width": args.size, "image_height": args.size, "database_path": str(database),
        "minimum_tag_count": 0, "model": args.model, "minibatch_size": args.batch, "epoch_count": 1,
        "checkpoint_frequency_mb": DEFAULT_CADENCE_MB, "console_logging_frequency_mb": args.log_every,
        "validation_fraction": 0.0,
    }
    (project / "project.json").write_text(json.dumps(config, indent=2))
    (project / "tags.txt").write_text("\n".join(tags) + "\n")
    return project


_STEP_LINE = re.compile(r"^epoch \d+/\d+ step (\d+):")
_CHECKPOINT_LINE = re.compile(r"^Checkpoint .*, ([0-9.]+) s\)$")


def _real(args, directory: Path) -> dict:
    project = _make_project(directory, args)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    lines, seconds, rss = _run([sys.executable, "-m", "deepdanbooru", "train-project", str(project)], env=env)
    steps = [(at, int(m.group(1))) for at, text in lines if (m := _STEP_LINE.match(text))]
    checkpoints = [float(m.group(1)) for _, text in lines if (m := _CHECKPOINT_LINE.match(text))]
    if len(steps) < 2:
        raise SystemExit("too few progress lines for a steady rate; lower --log-every or raise --samples")
    (first_at, first_step), (last_at, last_step) = steps[0], steps[-1]
    return {
        "steady_samples_per_second": (last_step - first_step) * args.batch / (last_at - first_at),
        "whole_seconds": seconds,
        "whole_samples_per_second": args.samples / seconds,
        "first_line_seconds": first_at,
        "peak_rss_bytes": rss,
        "checkpoint_seconds": max(checkpoints) if checkpoints else None,
        "checkpoint_bytes": sum(p.stat().st_size for p in (project / "checkpoints").glob("ckpt-*")),
    }


def _model_only(args, tag_count: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    lines, seconds, rss = _run([sys.executable, "-c", MODEL_ONLY, str(ROOT), args.model, str(args.size),
                                str(args.batch), str(args.samples), str(tag_count)], env=env)
    result = json.loads(lines[-1][1])
    result["peak_rss_bytes"] = rss
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet_custom_v4")
    parser.add_argument("--size", type=int, default=128, help="model input side")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--samples", type=int, default=320)
    parser.add_argument("--image-size", type=int, default=256, help="side of the generated JPEGs")
    parser.add_argument("--log-every", type=int, default=2, help="console_logging_frequency_mb of the real run")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs; the median ratio is reported")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from deepdanbooru.sample.generator import TAGS

    pairs = []
    for index in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-train-") as directory:
            real = _real(args, Path(directory))
        model_only = _model_only(args, len(TAGS))
        pair = {
            "real": real, "model_only": model_only,
            "steady_ratio": real["steady_samples_per_second"] / model_only["steady_samples_per_second"],
            "whole_run_ratio": real["whole_samples_per_second"] / model_only["steady_samples_per_second"],
            "rss_ratio": real["peak_rss_bytes"] / model_only["peak_rss_bytes"],
            "bound_whole_run_ratio": (model_only["whole_samples"] / model_only["whole_seconds"]
                                      / model_only["steady_samples_per_second"]),
        }
        if real["checkpoint_seconds"] is not None:
            slice_seconds = DEFAULT_CADENCE_MB * args.batch / real["steady_samples_per_second"]
            pair["checkpoint_share"] = real["checkpoint_seconds"] / (real["checkpoint_seconds"] + slice_seconds)
        pairs.append(pair)
        print(f"run {index + 1}: real steady {real['steady_samples_per_second']:.2f} samples/s, whole run "
              f"{real['whole_samples_per_second']:.2f} samples/s ({real['whole_seconds']:.1f} s, first progress "
              f"line at {real['first_line_seconds']:.1f} s), peak RSS {real['peak_rss_bytes'] / 2**20:.0f} MiB, "
              f"checkpoint {real['checkpoint_seconds']} s ({real['checkpoint_bytes'] / 2**20:.0f} MiB)")
        print(f"       model-only steady {model_only['steady_samples_per_second']:.2f} samples/s, whole "
              f"{model_only['whole_seconds']:.1f} s (first timed step at {model_only['first_step_seconds']:.1f} s), "
              f"peak RSS {model_only['peak_rss_bytes'] / 2**20:.0f} MiB, its own whole-run ratio "
              f"{pair['bound_whole_run_ratio']:.3f}")
        print(f"       ratios: steady {pair['steady_ratio']:.3f}, whole run {pair['whole_run_ratio']:.3f}, "
              f"rss {pair['rss_ratio']:.3f}, checkpoint share at {DEFAULT_CADENCE_MB} mb "
              f"{pair.get('checkpoint_share', float('nan')):.4f}")

    def median(key):
        values = sorted(p[key] for p in pairs if key in p)
        return values[len(values) // 2] if values else None

    print(json.dumps({
        "model": args.model, "size": args.size, "batch": args.batch, "samples": args.samples,
        "steady_ratio": median("steady_ratio"), "whole_run_ratio": median("whole_run_ratio"),
        "rss_ratio": median("rss_ratio"), "checkpoint_share": median("checkpoint_share"),
        "bound_whole_run_ratio": median("bound_whole_run_ratio"),
        "runs": pairs,
    }))


if __name__ == "__main__":
    main()
